"""AsyncLLM with a real engine process (tiny random model): streaming, cancellation, utilities."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proto.engine_config import EngineConfig
from proto.engine_output import SchedulerStats
from service.client.async_mp_client import AsyncMPClient
from service.frontend.async_llm import AsyncLLM
from service.frontend.outputs import RequestOutput
from service.frontend.sampling_params import SamplingParams
from service.model_files.tokenizer import Tokenizer


@pytest.fixture
async def llm(tiny_model_dir: Path) -> AsyncIterator[AsyncLLM]:
    args = EngineConfig(model_path=str(tiny_model_dir), model_name="tiny", kv_cache_memory_gib=0.05,
                      max_model_len=1024, num_threads=1)
    client = AsyncMPClient(args)
    ready = await client.wait_ready(timeout=120)
    llm = AsyncLLM(client, Tokenizer.from_model(tiny_model_dir), ready)
    yield llm
    llm.shutdown()


async def generate(
    llm: AsyncLLM, request_id: str, prompt_ids: list[int], params: SamplingParams
) -> AsyncIterator[RequestOutput]:
    requests = llm.input_processor.process(request_id, prompt_ids, params)
    async with contextlib.aclosing(llm.generate(requests, params)) as stream:
        async for _, output in stream:
            yield output


async def stats_once_idle(llm: AsyncLLM, timeout_s: float = 120.0) -> SchedulerStats:
    """The engine's stats once it runs no request (or when `timeout_s` is up: generous, as a busy
    machine may take many times as long to end an aborted request)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    current = await llm.get_stats()
    while current.num_running_reqs and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
        current = await llm.get_stats()
    return current


async def test_generate_streams_deltas_until_max_tokens(llm: AsyncLLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=7, ignore_eos=True)
    outputs = [output async for output in generate(llm, "r1", [1, 2, 3], params)]
    assert sum(len(o.outputs[0].token_ids) for o in outputs) == 7
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "length"
    assert not any(o.finished for o in outputs[:-1])
    assert llm.output_processor.num_unfinished_requests == 0


async def test_stop_string_ends_the_request_and_aborts_it_in_the_engine(llm: AsyncLLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    prompt_ids = llm.input_processor.text_prompt("The quick brown fox").token_ids
    text = "".join([o.outputs[0].text async for o in generate(llm, "probe", prompt_ids, params)])
    stop = text[2:4]
    long_params = SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True, stop=[stop])
    outputs = [o async for o in generate(llm, "stopped", prompt_ids, long_params)]
    assert "".join(o.outputs[0].text for o in outputs) == text[: text.index(stop)]
    assert outputs[-1].outputs[0].finish_reason == "stop" and outputs[-1].outputs[0].stop_reason == stop
    current = await stats_once_idle(llm)
    assert current.num_running_reqs == 0 and current.kv_cache_usage == 0.0


async def test_closing_generate_aborts_the_request_in_the_engine(llm: AsyncLLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True)
    stream = generate(llm, "long", [1, 2, 3], params)
    await stream.__anext__()
    assert (await llm.get_stats()).num_running_reqs == 1
    await stream.aclose()
    current = await stats_once_idle(llm)
    assert current.num_running_reqs == 0
    assert current.kv_cache_usage == 0.0
    assert llm.output_processor.num_unfinished_requests == 0


async def test_n_samples_stream_through_one_generator_and_closing_it_aborts_them_all(llm: AsyncLLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True, n=3)
    stream = llm.generate(llm.input_processor.process("three", [1, 2, 3], params), params)
    seen: set[int] = set()
    async for index, _ in stream:
        seen.add(index)
        if seen == {0, 1, 2}:
            break
    assert (await llm.get_stats()).num_running_reqs == 3
    await stream.aclose()
    current = await stats_once_idle(llm)
    assert current.num_running_reqs == 0 and llm.output_processor.num_unfinished_requests == 0


async def test_cancelling_the_consumer_task_aborts_too(llm: AsyncLLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=900, ignore_eos=True)
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in generate(llm, "cancelled", [4, 5, 6], params):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await stats_once_idle(llm)).num_running_reqs == 0


async def test_unknown_utility_is_an_error_not_a_hang(llm: AsyncLLM) -> None:
    with pytest.raises(RuntimeError, match="unknown utility"):
        await llm.engine_client.call_utility_async("no_such_method")
    assert await llm.engine_client.call_utility_async("ping") == "pong"
