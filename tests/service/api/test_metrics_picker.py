"""/metrics read as the Gateway API Inference Extension's endpoint picker reads a pod it takes for
vLLM (its default): the same metric names, the same choice of series and the same values, under a
load that queues requests."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proto.engine_input import EngineCoreRequest
from proto.engine_output import EngineCoreOutputs, SchedulerStats
from service.client.engine_state import EngineLost
from service.model_files.tokenizer import Tokenizer
from tests.service.api.fake_engine import FakeEngineClient
from tests.service.api.picker_reader import VLLM_MAPPING, read_as_the_picker

COMPLETIONS = "/v1/completions"
MAX_NUM_RUNNING = 2
NUM_REQUESTS = 3


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
