"""The three engine clients, over a real engine (tiny random model): same outputs, same utilities."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from proto.engine_output import EngineCoreOutputs
from service.client.async_mp_client import AsyncMPClient
from service.client.core_client import EngineCoreClient, EngineDeadError
from service.client.inproc_client import InprocClient
from service.client.make_client import make_client
from service.client.sync_mp_client import SyncMPClient

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [42] * 20, [7, 300, 9000]]
PARAMS = [
    SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True),
    SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=-5, max_tokens=9, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True),
    SamplingParams(temperature=1.3, min_p=0.01, repetition_penalty=1.2, seed=99, max_tokens=11, ignore_eos=True),
]


@pytest.fixture(scope="module")
def engine_config(tiny_model_dir: Path) -> EngineConfig:
    return EngineConfig(
        model_path=str(tiny_model_dir), model_name="tiny", kv_cache_memory_gib=0.05, max_model_len=1024,
        num_threads=1,
    )


def requests(tag: str) -> list[EngineCoreRequest]:
    return [EngineCoreRequest(f"{tag}-{i}", p, s) for i, (p, s) in enumerate(zip(PROMPTS, PARAMS, strict=True))]


def run_sync(client: EngineCoreClient) -> list[list[int]]:
    """Each request alone (so every client runs identical batches), to the end."""
    results = []
    for request in requests("sync"):
        client.add_request(request)
        token_ids: list[int] = []
        is_finished = False
        while not is_finished:
            for output in client.get_output().outputs:
                assert output.request_id == request.request_id
                token_ids += output.new_token_ids
                is_finished = output.is_finished
        results.append(token_ids)
    return results


async def run_async(client: EngineCoreClient) -> list[list[int]]:
    results = []
    for request in requests("async"):
        await client.add_request_async(request)
        token_ids: list[int] = []
        is_finished = False
        while not is_finished:
            outputs = await client.get_output_async()
            assert isinstance(outputs, EngineCoreOutputs)
            for output in outputs.outputs:
                token_ids += output.new_token_ids
                is_finished = output.is_finished
        results.append(token_ids)
    return results


async def test_the_three_clients_give_identical_outputs(engine_config: EngineConfig) -> None:
    inproc = make_client(engine_config, multiprocess_mode=False, asyncio_mode=False)
    try:
        assert isinstance(inproc, InprocClient)
        inproc_results = run_sync(inproc)
    finally:
        inproc.shutdown()
    sync_mp = make_client(engine_config, multiprocess_mode=True, asyncio_mode=False)
    try:
        assert isinstance(sync_mp, SyncMPClient)
        sync_results = run_sync(sync_mp)
    finally:
        sync_mp.shutdown()
    async_mp = make_client(engine_config, multiprocess_mode=True, asyncio_mode=True)
    try:
        assert isinstance(async_mp, AsyncMPClient)
        await async_mp.wait_ready(timeout=120)
        async_results = await run_async(async_mp)
    finally:
        async_mp.shutdown()
    assert [len(r) for r in inproc_results] == [p.max_tokens for p in PARAMS]
    assert inproc_results == sync_results == async_results
    # NOTE: seeded sampling really sampled: the seeded requests do not all repeat one token.
    assert any(len(set(r)) > 1 for r in inproc_results)


@pytest.mark.parametrize("multiprocess_mode", [False, True])
def test_sync_clients_answer_utilities(engine_config: EngineConfig, multiprocess_mode: bool) -> None:
    client = make_client(engine_config, multiprocess_mode, asyncio_mode=False)
    try:
        assert client.call_utility("ping") == "pong"
        assert client.reset_prefix_cache() is True
        stats = client.get_stats()
        assert (stats.num_running_reqs, stats.num_waiting_reqs, stats.kv_cache_usage) == (0, 0, 0.0)
        assert stats.num_free_blocks > 0
        assert not client.is_sleeping()
        client.sleep(1)
        assert client.is_sleeping()
        client.wake_up()
        assert not client.is_sleeping()
        with pytest.raises(RuntimeError, match="unknown utility"):
            client.call_utility("no_such_method")
    finally:
        client.shutdown()


def test_inproc_client_steps_nothing_when_idle(engine_config: EngineConfig) -> None:
    client = InprocClient(engine_config)
    try:
        assert client.get_output().outputs == []
    finally:
        client.shutdown()


def test_sync_mp_client_reports_a_dead_engine(engine_config: EngineConfig) -> None:
    client = SyncMPClient(engine_config)
    try:
        client.add_request(EngineCoreRequest("long", [1, 2, 3], SamplingParams(max_tokens=900, ignore_eos=True)))
        client.get_output()
        os.kill(client.engine_pid, signal.SIGKILL)
        with pytest.raises(EngineDeadError):
            for _ in range(10_000):
                client.get_output()
        assert client.is_dead
        with pytest.raises(EngineDeadError):
            client.add_request(EngineCoreRequest("late", [1], SamplingParams()))
    finally:
        client.shutdown()


def test_asyncio_client_needs_a_process(engine_config: EngineConfig) -> None:
    with pytest.raises(ValueError, match="another process"):
        make_client(engine_config, multiprocess_mode=False, asyncio_mode=True)
