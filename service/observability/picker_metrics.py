"""The model-server protocol's metrics: the figures the Gateway API Inference Extension's endpoint
picker reads from a pod (its queue, running requests, KV cache use, LoRA adapters and KV cache
shape), under the names of the picker's built-in vLLM mapping.

NOTE: always on, not behind a flag. The picker chooses a pod's metric names by the pod's
`inference.networking.k8s.io/engine-type` label, vLLM's when there is none, and knows vLLM's,
SGLang's and TensorRT-LLM's only. A pod it cannot read keeps the figures at 0 and looks idle,
so it would draw every request; five small gauges cost less than that surprise.

A stat logger of its own, beside a PrometheusStatLogger: it declares its families where that one
does (`families_registry`), so a scrape of /metrics has both.

NOTE: one series per family, the pod's figure. The picker reads the newest series of a family
(by timestamp; none here, so the first), so per-engine series would show it engine 0 alone, and
per-model series its first model alone: a multi-model server's /metrics has `pod_families` of its
loaded models instead of each model's own."""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Sequence
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Gauge, Metric
from prometheus_client.core import GaugeMetricFamily

from proto.engine_output import SchedulerStats
from service.observability.metrics import PrometheusStatLogger
from service.observability.stats import IterationStats

QUEUED_REQUESTS = "vllm:num_requests_waiting"
RUNNING_REQUESTS = "vllm:num_requests_running"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
LORA_INFO = "vllm:lora_requests_info"
CACHE_INFO = "vllm:cache_config_info"
PICKER_FAMILIES = (QUEUED_REQUESTS, RUNNING_REQUESTS, KV_CACHE_USAGE, LORA_INFO, CACHE_INFO)
LORA_INFO_LABELS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")


class PickerMetrics:
    """The endpoint picker's figures for this pod: its engines' queues and batches summed, their
    KV cache use averaged, no LoRA adapters, and the KV blocks of all its engines."""

    def __init__(self, metrics: PrometheusStatLogger, engine_indexes: Sequence[int] = (0,)) -> None:
        registry, model_name, cache_info = metrics.families_registry, metrics.model_name, metrics.cache_info

        def gauge(name: str, documentation: str, labels: Sequence[str] = ("model_name",)) -> Gauge:
            # NOTE: across gateway processes, the value most recently set by any of them.
            return Gauge(name, documentation, labels, registry=registry, multiprocess_mode="mostrecent")

        self._queued = gauge(QUEUED_REQUESTS, "Requests waiting in this pod's engines.").labels(model_name)
        self._running = gauge(RUNNING_REQUESTS, "Requests in this pod's engines' running batches.").labels(model_name)
        self._kv_cache_usage = gauge(
            KV_CACHE_USAGE, "KV cache usage over this pod's engines; 1 means 100 percent."
        ).labels(model_name)
        # NOTE: no adapters can be loaded (max_lora 0), so the picker's LoRA affinity scores every
        # zeroserve pod alike; the value is when the labels were set, as vLLM's, and they never change.
        lora_info = gauge(LORA_INFO, "LoRA adapters: none are served (always the time it was set).", LORA_INFO_LABELS)
        lora_info.labels(max_lora="0", running_lora_adapters="", waiting_lora_adapters="").set(time.time())
        if "block_size" in cache_info and "num_gpu_blocks" in cache_info:
            # NOTE: the picker sizes its guess of a pod's prefix cache by num_gpu_blocks: the pod's, all engines'.
            num_gpu_blocks = str(int(cache_info["num_gpu_blocks"]) * max(len(engine_indexes), 1))
            labels = {**cache_info, "num_gpu_blocks": num_gpu_blocks}
            gauge(CACHE_INFO, "This pod's KV cache configuration (always 1).", tuple(labels)).labels(**labels).set(1)
        self._stats = {engine_index: SchedulerStats() for engine_index in engine_indexes}

    def record(
        self, engine_index: int, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        if scheduler_stats is not None:
            self._stats[engine_index] = scheduler_stats
            self._update()

    def log(self) -> None:
        """Nothing to do: Prometheus scrapes the registry."""

    def keep_engines(self, engine_indices: Collection[int]) -> None:
        """An engine gone holds nothing: the pod's figures are its other engines'."""
        for engine_index in set(self._stats) - set(engine_indices):
            del self._stats[engine_index]
        self._update()

    def _update(self) -> None:
        stats = list(self._stats.values())
        self._queued.set(sum(s.num_waiting_reqs for s in stats))
        self._running.set(sum(s.num_running_reqs for s in stats))
        # NOTE: every engine has the same number of blocks, so the mean is the pod's share in use.
        self._kv_cache_usage.set(sum(s.kv_cache_usage for s in stats) / len(stats) if stats else 0.0)


def pod_families(registries: Iterable[CollectorRegistry]) -> list[Metric]:
    """The picker's families for a pod that serves several models, each model's registry holding its own:
    one series each, the queues and batches summed over the models, the KV cache use as the share of all
    their blocks in use (each model's use weighted by its blocks), their blocks summed in cache_config_info
    (its other labels the first model's), no LoRA adapters. With no model loaded: an idle pod, no cache info."""
    models = [_ModelFigures.read(registry) for registry in registries]
    num_blocks = sum(model.num_blocks for model in models)
    used_blocks = sum(model.kv_cache_usage * model.num_blocks for model in models)
    families: list[Metric] = [
        GaugeMetricFamily(QUEUED_REQUESTS, "Requests waiting in this pod's engines, over its models.",
                          value=sum(model.num_waiting for model in models)),
        GaugeMetricFamily(RUNNING_REQUESTS, "Requests in this pod's engines' running batches, over its models.",
                          value=sum(model.num_running for model in models)),
        GaugeMetricFamily(KV_CACHE_USAGE, "KV cache blocks in use over all this pod's models' blocks; 1 means 100 percent.",
                          value=used_blocks / num_blocks if num_blocks else 0.0),
    ]
    lora_info = GaugeMetricFamily(LORA_INFO, "LoRA adapters: none are served (always the time it was set).",
                                  labels=LORA_INFO_LABELS)
    lora_info.add_metric(("0", "", ""), min((model.lora_info for model in models), default=time.time()))
    families.append(lora_info)
    cache_labels = next((model.cache_labels for model in models if model.cache_labels), None)
    if cache_labels is not None:
        labels = {**cache_labels, "num_gpu_blocks": str(num_blocks)}
        cache_info = GaugeMetricFamily(CACHE_INFO, "This pod's KV cache configuration (always 1).", labels=tuple(labels))
        cache_info.add_metric(tuple(labels.values()), 1.0)
        families.append(cache_info)
    return families


class _ModelFigures(NamedTuple):
    """One model's picker figures, read back from its registry."""

    num_waiting: float
    num_running: float
    kv_cache_usage: float
    lora_info: float
    num_blocks: int
    cache_labels: dict[str, str]

    @staticmethod
    def read(registry: CollectorRegistry) -> _ModelFigures:
        values: dict[str, float] = {}
        cache_labels: dict[str, str] = {}
        for family in registry.collect():
            for sample in family.samples if family.name in PICKER_FAMILIES else ():
                values[family.name] = sample.value
                cache_labels = dict(sample.labels) if family.name == CACHE_INFO else cache_labels
        return _ModelFigures(
            values.get(QUEUED_REQUESTS, 0.0), values.get(RUNNING_REQUESTS, 0.0), values.get(KV_CACHE_USAGE, 0.0),
            values.get(LORA_INFO, time.time()), int(cache_labels.get("num_gpu_blocks", 0)), cache_labels,
        )
