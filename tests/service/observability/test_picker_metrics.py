"""The endpoint picker's figures: one series per family, the pod's queue, batch and KV cache use
over its engines (and over its models on a multi-model server), no LoRA adapters, and its KV blocks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from proto.engine_output import SchedulerStats
from service.api.metrics_route import pool_registry
from service.models.model_pool import ModelPool
from service.observability.metrics import PrometheusStatLogger
from service.observability.picker_metrics import PICKER_FAMILIES, PickerMetrics
from tests.service.api.picker_reader import VLLM_MAPPING, read_as_the_picker

CACHE_INFO = {"block_size": "16", "num_gpu_blocks": "128", "enable_prefix_caching": "True", "cache_dtype": "auto"}


def loggers(engine_indexes: list[int]) -> tuple[PrometheusStatLogger, PickerMetrics]:
    """zeroserve's metrics, and the picker's beside them."""
    metrics = PrometheusStatLogger("tiny", engine_indexes=engine_indexes, cache_info=CACHE_INFO)
    return metrics, PickerMetrics(metrics, engine_indexes)


def picker_samples(metrics: PrometheusStatLogger) -> dict[str, list[Sample]]:
    """The samples of every `vllm:` family a scrape has, by family name."""
    text = generate_latest(metrics.registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}


def only_value(samples: dict[str, list[Sample]], name: str) -> float:
    (sample,) = samples[name]
    return sample.value


def test_the_pods_figures_are_its_engines_queues_and_batches_summed_and_kv_use_averaged() -> None:
    metrics, picker = loggers([0, 1])
    picker.record(0, SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5), None)
    picker.record(1, SchedulerStats(num_running_reqs=1, num_waiting_reqs=4, kv_cache_usage=0.25), None)
    samples = picker_samples(metrics)
    assert only_value(samples, "vllm:num_requests_waiting") == 6
    assert only_value(samples, "vllm:num_requests_running") == 4
    assert only_value(samples, "vllm:kv_cache_usage_perc") == 0.375
    assert samples["vllm:num_requests_waiting"][0].labels == {"model_name": "tiny"}


def test_an_engine_gone_leaves_the_pods_figures_to_the_others() -> None:
    metrics, picker = loggers([0, 1])
    picker.record(0, SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5), None)
    picker.record(1, SchedulerStats(num_running_reqs=1, num_waiting_reqs=4, kv_cache_usage=0.25), None)
    picker.keep_engines([1])
    samples = picker_samples(metrics)
    assert only_value(samples, "vllm:num_requests_waiting") == 4
    assert only_value(samples, "vllm:num_requests_running") == 1
    assert only_value(samples, "vllm:kv_cache_usage_perc") == 0.25


def test_no_lora_adapters_and_the_kv_blocks_of_every_engine() -> None:
    samples = picker_samples(loggers([0, 1])[0])
    (lora,) = samples["vllm:lora_requests_info"]
    assert lora.labels == {"max_lora": "0", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    assert lora.value > 0
    (cache,) = samples["vllm:cache_config_info"]
    assert cache.labels == {**CACHE_INFO, "num_gpu_blocks": "256"} and cache.value == 1


# NOTE: prometheus_client picks its multiprocess mode when imported, so each gateway is a process.
GATEWAY_SCRIPT = """
import sys
from prometheus_client import generate_latest
from proto.engine_output import SchedulerStats
from service.observability.metrics import PrometheusStatLogger
from service.observability.picker_metrics import PICKER_FAMILIES, PickerMetrics

index, num_waiting = (int(arg) for arg in sys.argv[1:])
metrics = PrometheusStatLogger("tiny", api_server_index=index, cache_info=%r)
PickerMetrics(metrics).record(0, SchedulerStats(num_waiting_reqs=num_waiting), None)
sys.stdout.write(generate_latest(metrics.registry).decode())
""" % CACHE_INFO


def test_gateway_processes_show_the_picker_one_series_of_each_family(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for index, num_waiting in ((0, 5), (1, 2)):
        result = subprocess.run(
            [sys.executable, "-c", GATEWAY_SCRIPT, str(index), str(num_waiting)],
            env=env, capture_output=True, text=True, check=True,
        )
    samples = {f.name: f.samples for f in text_string_to_metric_families(result.stdout) if f.name.startswith("vllm:")}
    assert {name: len(family) for name, family in samples.items()} == dict.fromkeys(PICKER_FAMILIES, 1)
    assert only_value(samples, "vllm:num_requests_waiting") == 2


def pool_scrape(models: dict[str, tuple[int, SchedulerStats]]) -> str:
    """/metrics of a multi-model server whose loaded models (by id: blocks per engine, their one engine's
    stats) report what they are given."""
    states = []
    for model_id, (num_blocks, stats) in models.items():
        metrics = PrometheusStatLogger(model_id, cache_info={**CACHE_INFO, "num_gpu_blocks": str(num_blocks)})
        PickerMetrics(metrics).record(0, stats, None)
        states.append(SimpleNamespace(metrics_registry=metrics.registry))
    pool = SimpleNamespace(slots={}, loaded_states=states)
    return generate_latest(pool_registry(cast(ModelPool, pool))).decode()


def test_a_multi_model_pod_shows_the_picker_one_series_over_its_models() -> None:
    text = pool_scrape({
        "alpha": (128, SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5)),
        "beta": (64, SchedulerStats(num_running_reqs=1, num_waiting_reqs=4, kv_cache_usage=0.25)),
    })
    samples = {f.name: f.samples for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}
    assert {name: len(family) for name, family in samples.items()} == dict.fromkeys(PICKER_FAMILIES, 1)
    pod = read_as_the_picker(text, VLLM_MAPPING)
    assert pod.errors == []
    assert (pod.waiting_queue_size, pod.running_requests_size) == (6, 4)
    # NOTE: blocks in use over all blocks: (64 + 16) of (128 + 64).
    assert pod.kv_cache_usage_percent == 80 / 192
    assert (pod.cache_block_size, pod.cache_num_blocks) == (16, 192)
    assert (pod.max_active_models, pod.active_models, pod.waiting_models) == (0, {}, {})
    # NOTE: each model's own figures stay in zeroserve's families, under its name.
    assert {sample.labels["model_name"] for sample in samples_of(text, "zeroserve:num_requests_waiting")} == {"alpha", "beta"}


def test_a_multi_model_pod_with_no_model_loaded_reads_as_idle() -> None:
    pod = read_as_the_picker(pool_scrape({}), VLLM_MAPPING)
    assert (pod.waiting_queue_size, pod.running_requests_size, pod.kv_cache_usage_percent) == (0, 0, 0.0)
    assert pod.errors == ["metric family 'vllm:cache_config_info' not found"]


def samples_of(text: str, name: str) -> list[Sample]:
    return [sample for family in text_string_to_metric_families(text) if family.name == name for sample in family.samples]
