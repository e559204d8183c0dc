"""/metrics read as the Gateway API Inference Extension's endpoint picker reads a pod it takes for
vLLM (its default): the same metric names, the same choice of series and the same values, under a
load that queues requests."""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from proto.engine_input import EngineCoreRequest
from proto.engine_output import EngineCoreOutputs, SchedulerStats
from service.client.engine_state import EngineLost
from service.model_files.tokenizer import Tokenizer
from tests.service.api.fake_engine import FakeEngineClient

# NOTE: the picker's built-in vLLM mapping, verbatim: defaultEngineConfigs in
# pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go and the --*-metric flags'
# defaults in pkg/epp/server/options.go, kubernetes-sigs/gateway-api-inference-extension at
# 1748e829d1161147aaf35e76699ec86fd88406d2 (2026-06-16).
VLLM_MAPPING = {
    "QueuedRequestsSpec": "vllm:num_requests_waiting",
    "RunningRequestsSpec": "vllm:num_requests_running",
    "KVUsageSpec": "vllm:kv_cache_usage_perc",
    "LoRASpec": "vllm:lora_requests_info",
    "CacheInfoSpec": "vllm:cache_config_info",
}
COMPLETIONS = "/v1/completions"
MAX_NUM_RUNNING = 2
NUM_REQUESTS = 3


@dataclass
class PodMetrics:
    """What the picker keeps of a pod (fwkdl.Metrics), and the errors its extractor reports."""

    waiting_queue_size: int = 0
    running_requests_size: int = 0
    kv_cache_usage_percent: float = 0.0
    max_active_models: int = 0
    active_models: dict[str, int] = field(default_factory=dict)
    waiting_models: dict[str, int] = field(default_factory=dict)
    cache_block_size: int = 0
    cache_num_blocks: int = 0
    errors: list[str] = field(default_factory=list)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """parseStringToSpec: `name{label=value,...}`, labels optional, quotes optional."""
    match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?", spec)
    assert match is not None, spec
    pairs = re.findall(r'(\w+)\s*=\s*"?([^",}]*)"?', match.group(2) or "")
    return match.group(1), dict(pairs)


def latest_metric(families: dict[str, Metric], spec: str, is_lora: bool = False) -> Sample:
    """Spec.getLatestMetric (the newest matching series by timestamp, the first when none has one),
    or LoRASpec.getLatestMetric (the matching series of the largest value)."""
    name, labels = parse_spec(spec)
    family = families.get(name)
    if family is None:
        raise LookupError(f"metric family {name!r} not found")
    if not family.samples:
        raise LookupError(f"no metrics found for {name!r}")
    latest, recent = None, -1.0
    for sample in family.samples:
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            # NOTE: Go's GetTimestampMs() is 0 for a sample without one.
            key = extract_value(family, sample) if is_lora else float(sample.timestamp or 0)
            if key > recent:
                latest, recent = sample, key
    if latest is None:
        raise LookupError(f"no matching metric found for {name!r} with labels {labels}")
    return latest


def extract_value(family: Metric, sample: Sample) -> float:
    """extractValue: a gauge's or counter's value, 0 for any other type."""
    return sample.value if family.type in ("gauge", "counter") else 0.0


def read_as_the_picker(text: str, mapping: dict[str, str]) -> PodMetrics:
    """Extractor.Extract on the text a scrape returned, parsed as the picker's text parser would."""
    families = {family.name: family for family in text_string_to_metric_families(text)}
    pod = PodMetrics()
    numbers = (("QueuedRequestsSpec", "waiting_queue_size", int), ("RunningRequestsSpec", "running_requests_size", int),
               ("KVUsageSpec", "kv_cache_usage_percent", float))
    for spec_key, attribute, convert in numbers:
        try:
            sample = latest_metric(families, mapping[spec_key])
        except LookupError as error:
            pod.errors.append(str(error))
            continue
        setattr(pod, attribute, convert(extract_value(families[parse_spec(mapping[spec_key])[0]], sample)))
    try:
        lora = latest_metric(families, mapping["LoRASpec"], is_lora=True).labels
        pod.active_models = {a.strip(): 0 for a in lora.get("running_lora_adapters", "").split(",") if a.strip()}
        pod.waiting_models = {a.strip(): 0 for a in lora.get("waiting_lora_adapters", "").split(",") if a.strip()}
        pod.max_active_models = int(lora["max_lora"]) if lora.get("max_lora") else 0
    except LookupError as error:
        pod.errors.append(str(error))
    try:
        cache = latest_metric(families, mapping["CacheInfoSpec"]).labels
        pod.cache_block_size = int(cache.get("block_size") or 0)
        pod.cache_num_blocks = int(cache.get("num_gpu_blocks") or 0)
    except LookupError as error:
        pod.errors.append(str(error))
    return pod


def zeroserves_own(text: str) -> tuple[float, float, float]:
    """zeroserve's queue, running requests and KV cache use over its engines, from its own families."""
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        values[family.name] = [sample.value for sample in family.samples]
    kv_cache_usage = values["zeroserve:kv_cache_usage_perc"]
    return (sum(values["zeroserve:num_requests_waiting"]), sum(values["zeroserve:num_requests_running"]),
            sum(kv_cache_usage) / len(kv_cache_usage))


class QueueingEngine(FakeEngineClient):
    """A fake engine that runs MAX_NUM_RUNNING requests at a time while the rest wait, reports its
    queue, batch and KV blocks held as the engine does, and holds still once a step has run with a
    queue (its output seen by the gateway) until `release` is set."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        super().__init__(tokenizer)
        self.waiting: list[EngineCoreRequest] = []
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.stats = SchedulerStats()

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        if len(self.running_ids) < MAX_NUM_RUNNING:
            await super().add_request_async(request)
        else:
            self.waiting.append(request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        self.waiting = [request for request in self.waiting if request.request_id not in request_ids]
        await super().abort_requests_async(request_ids)

    async def get_output_async(self) -> EngineCoreOutputs | EngineLost:
        if self.stats.num_waiting_reqs and not self.release.is_set():
            self.held.set()
            await self.release.wait()
        while self.waiting and len(self.running_ids) < MAX_NUM_RUNNING:
            await super().add_request_async(self.waiting.pop(0))
        return await super().get_output_async()

    def _step(self) -> EngineCoreOutputs:
        outputs = super()._step()
        num_blocks_held = sum(
            math.ceil((len(running.request.prompt_token_ids) + running.num_output_tokens) / self.ready.block_size)
            for running in self._running.values()
        )
        self.stats = SchedulerStats(
            num_running_reqs=len(self._running), num_waiting_reqs=len(self.waiting),
            kv_cache_usage=num_blocks_held / self.ready.num_kv_blocks,
        )
        outputs.scheduler_stats = self.stats
        return outputs


@pytest.fixture
def engine(tokenizer: Tokenizer) -> FakeEngineClient:
    return QueueingEngine(tokenizer)


async def test_the_pickers_vllm_mapping_reads_zeroserves_queue_running_and_kv_cache_use(
    api: httpx.AsyncClient, engine: QueueingEngine
) -> None:
    body = {"prompt": "Picker test", "max_tokens": 40, "ignore_eos": True}
    requests = [asyncio.create_task(api.post(COMPLETIONS, json=body)) for _ in range(NUM_REQUESTS)]
    # NOTE: bounds a wait that would otherwise never end; the engine holds still once loaded.
    await asyncio.wait_for(engine.held.wait(), timeout=10.0)
    text, held_stats = (await api.get("/metrics")).text, engine.stats
    engine.release.set()
    assert all(response.status_code == 200 for response in await asyncio.gather(*requests))

    pod = read_as_the_picker(text, VLLM_MAPPING)
    assert pod.errors == []
    assert (pod.waiting_queue_size, pod.running_requests_size) == (NUM_REQUESTS - MAX_NUM_RUNNING, MAX_NUM_RUNNING)
    assert pod.kv_cache_usage_percent == held_stats.kv_cache_usage > 0
    assert (pod.waiting_queue_size, pod.running_requests_size, pod.kv_cache_usage_percent) == zeroserves_own(text)
    # NOTE: no adapters can be loaded: the picker's LoRA affinity scores every zeroserve pod alike.
    assert (pod.max_active_models, pod.active_models, pod.waiting_models) == (0, {}, {})
    assert (pod.cache_block_size, pod.cache_num_blocks) == (engine.ready.block_size, engine.ready.num_kv_blocks)


async def test_the_picker_reads_an_idle_pod_as_idle_without_errors(api: httpx.AsyncClient) -> None:
    await api.post(COMPLETIONS, json={"prompt": "Picker test", "max_tokens": 3})
    text = (await api.get("/metrics")).text
    pod = read_as_the_picker(text, VLLM_MAPPING)
    assert pod.errors == []
    assert (pod.waiting_queue_size, pod.running_requests_size, pod.kv_cache_usage_percent) == (0, 0, 0.0)
    assert (pod.waiting_queue_size, pod.running_requests_size, pod.kv_cache_usage_percent) == zeroserves_own(text)
