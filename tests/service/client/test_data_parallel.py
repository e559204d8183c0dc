"""Two local engines behind one AsyncLLM (tiny random model): load spread, ranks, a lost engine's
requests finishing on the other, seen in the per-engine counts of finished requests that /metrics shows."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import zmq
from prometheus_client import generate_latest

from proto.codec import MsgpackEncoder
from proto.engine_config import EngineConfig
from proto.engine_output import EngineCoreOutput, EngineCoreOutputs
from service.client.async_mp_client import AsyncMPClient
from service.client.curve import LinkSettings
from service.frontend.async_llm import AsyncLLM
from service.frontend.sampling_params import SamplingParams
from service.model_files.tokenizer import Tokenizer
from service.observability.metrics import PrometheusStatLogger
from tests.service.load_client import served_by_engine


@pytest.fixture
def metrics() -> PrometheusStatLogger:
    return PrometheusStatLogger("tiny", engine_indexes=(0, 1))


@pytest.fixture
async def llm(tiny_model_dir: Path, metrics: PrometheusStatLogger) -> AsyncIterator[AsyncLLM]:
    args = EngineConfig(model_path=str(tiny_model_dir), model_name="tiny", kv_cache_memory_gib=0.05,
                      max_model_len=1024, num_threads=1)
    client = AsyncMPClient(args, data_parallel_size=2)
    ready = await client.wait_ready(timeout=120)
    llm = AsyncLLM(client, Tokenizer.from_model(tiny_model_dir), ready, [metrics], stats_log_interval_s=0)
    yield llm
    llm.shutdown()


def finished_by_engine(metrics: PrometheusStatLogger) -> dict[str, float]:
    """Finished requests per engine index, as /metrics shows them."""
    return served_by_engine(generate_latest(metrics.registry).decode())


def client_of(llm: AsyncLLM) -> AsyncMPClient:
    assert isinstance(llm.engine_client, AsyncMPClient)
    return llm.engine_client


async def run(llm: AsyncLLM, request_id: str, max_tokens: int, rank: int | None = None) -> int:
    return len(await run_ids(llm, request_id, max_tokens, rank))


async def run_ids(llm: AsyncLLM, request_id: str, max_tokens: int, rank: int | None = None) -> list[int]:
    """One greedy request's output token ids."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    requests = llm.input_processor.process(request_id, [1, 2, 3, len(request_id)], params, data_parallel_rank=rank)
    token_ids = []
    async for _, output in llm.generate(requests, params):
        token_ids += output.outputs[0].token_ids
    return token_ids


async def test_64_requests_complete_spread_over_both_engines(llm: AsyncLLM, metrics: PrometheusStatLogger) -> None:
    client = client_of(llm)
    assert sorted(client.engines) == [0, 1]
    results = await asyncio.gather(*(run(llm, f"r{i}", 16 + i % 5) for i in range(64)))
    assert results == [16 + i % 5 for i in range(64)]
    served = finished_by_engine(metrics)
    assert set(served) == {"0", "1"}
    assert sum(served.values()) == 64 and max(served.values()) <= 0.7 * 64, served
    assert not client.request_owner
    assert all(e.load == (0, 0) for e in client.engines.values())


async def test_data_parallel_rank_picks_the_engine(llm: AsyncLLM, metrics: PrometheusStatLogger) -> None:
    await asyncio.gather(*(run(llm, f"pinned{i}", 4, rank=1) for i in range(6)))
    assert finished_by_engine(metrics) == {"0": 0, "1": 6}
    with pytest.raises(ValueError, match="data_parallel_rank 5"):
        await run(llm, "nowhere", 4, rank=5)


async def test_a_lost_engines_requests_finish_on_the_other_with_the_same_tokens(
    tiny_model_dir: Path, metrics: PrometheusStatLogger
) -> None:
    args = EngineConfig(model_path=str(tiny_model_dir), model_name="tiny", kv_cache_memory_gib=0.05,
                        max_model_len=1024, num_threads=1, dtype="float32")
    client = AsyncMPClient(args, data_parallel_size=2, link=LinkSettings(is_engine_restart=False))
    llm = AsyncLLM(client, Tokenizer.from_model(tiny_model_dir), await client.wait_ready(timeout=120), [metrics],
                   stats_log_interval_s=0)
    try:
        undisturbed = await asyncio.gather(*(run_ids(llm, f"long{i}", 400, rank=i % 2) for i in range(4)))
        assert finished_by_engine(metrics) == {"0": 2, "1": 2}
        long_runs = [asyncio.create_task(run_ids(llm, f"long{i}", 400, rank=i % 2)) for i in range(4)]
        while len(client.request_owner) < 4 or any(client.engines[i].waiting for i in (0, 1)):
            await asyncio.sleep(0.05)
        os.kill(client.processes[0].pid, signal.SIGKILL)
        # NOTE: engine 0's two requests continue on engine 1 from the tokens already streamed.
        assert await asyncio.wait_for(asyncio.gather(*long_runs), 60) == undisturbed
        assert not client.engines[0].is_alive and not llm.is_dead
        assert await run(llm, "after", 5) == 5
        assert finished_by_engine(metrics) == {"0": 2, "1": 2 + 4 + 1}
    finally:
        llm.shutdown()


async def test_outputs_of_a_request_from_an_engine_that_does_not_own_it_are_dropped(llm: AsyncLLM) -> None:
    """As from a lost engine that came back still running requests that moved on without it."""
    client = client_of(llm)
    undisturbed = await run_ids(llm, "pinned-a", 200, rank=1)
    running = asyncio.create_task(run_ids(llm, "pinned-b", 200, rank=1))  # NOTE: the same prompt
    while not client.request_owner:
        await asyncio.sleep(0.005)
    (request_id,) = client.request_owner
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(client.output_address)
    stale = EngineCoreOutputs(engine_index=0, outputs=[EngineCoreOutput(request_id, [7, 7, 7])])
    push.send_multipart(MsgpackEncoder().encode(stale))
    try:
        assert await asyncio.wait_for(running, 60) == undisturbed
    finally:
        push.close(0)
