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
(by timestamp; none here, so the first), so per-engine series would show it engine 0 alone."""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

from prometheus_client import Gauge

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
