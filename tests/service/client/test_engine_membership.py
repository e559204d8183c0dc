"""Headless engines joining and leaving a running gateway over TCP (loopback): one that leaves
cleanly drains first, one that disappears is taken out of rotation and its requests continue on
the others."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proto.engine_config import EngineConfig
from service.client.async_mp_client import AsyncMPClient
from service.client.curve import LinkSettings
from service.model_files.model_registry import resolve_model
from tests.server_process import ServerProcess, free_engine_port, running_server

ENGINE_FLAGS = ["--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "1024"]


@pytest.fixture
def gateway(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[ServerProcess, str, Path]]:
    engine_address = f"tcp://127.0.0.1:{free_engine_port()}"
    log = tmp_path / "gateway.log"
    with running_server(
        tiny_model_dir, "--data-parallel-size", "0", "--engine-address", engine_address, "--heartbeat-timeout", "2",
        *ENGINE_FLAGS, log_file=log, wait_healthy=False,
    ) as server:
        yield server, engine_address, log


def start_engine(model: Path, engine_address: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "service", "engine", str(model), "--gateway", engine_address, *ENGINE_FLAGS],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def wait_logged(log: Path, text: str, count: int = 1) -> None:
    """Returns once the gateway's log holds `text` `count` times (the gateway acts on an engine's
    message after the engine has sent it: a busy machine widens the gap)."""
    deadline = time.monotonic() + 120
    while log.read_text().count(text) < count:
        assert time.monotonic() < deadline, f"the gateway never logged {text!r}"
        time.sleep(0.2)


def wait_joined(log: Path, count: int) -> None:
    wait_logged(log, " joined from ", count)


async def stream(
    client: httpx.AsyncClient, prompt: str, max_tokens: int, started: asyncio.Event | None = None
) -> tuple[int, str | None, str]:
    """(tokens streamed, finish reason, error message) of one streamed completion; `started` is
    set once its first tokens arrive."""
    body = {
        "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True},
    }
    num_tokens, finish_reason, error = 0, None, ""
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                error = event["error"]["message"]
            elif event.get("usage"):
                num_tokens = event["usage"]["completion_tokens"]
            if event.get("choices"):
                finish_reason = event["choices"][0]["finish_reason"] or finish_reason
                if started is not None and event["choices"][0].get("text"):
                    started.set()
    return num_tokens, finish_reason, error


async def all_set(events: list[asyncio.Event]) -> None:
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in events)), timeout=120)


async def test_a_lost_engines_streams_finish_on_the_others_and_a_leaving_one_drains(
    gateway: tuple[ServerProcess, str, Path], tiny_model_dir: Path
) -> None:
    server, engine_address, log = gateway
    engines = [start_engine(tiny_model_dir, engine_address) for _ in range(3)]
    try:
        wait_joined(log, 3)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
            assert (await client.get("/health")).status_code == 200
            started = [asyncio.Event() for _ in range(6)]
            # NOTE: 1,000 tokens (the model length allows 1,024): the lost engine's streams must still run
            # when the last stream starts (600 ran out first once, at 3.6 ms a token, on a loaded machine).
            long_streams = [asyncio.create_task(stream(client, f"long {i}", 1000, started[i])) for i in range(6)]
            await all_set(started)  # NOTE: every engine has streams under way (two each, least loaded first)
            engines[0].send_signal(signal.SIGKILL)
            # NOTE: the lost engine's streams continue on the others: every stream is whole (however
            # long a busy machine takes: the client's timeout, not a wall-clock bound, ends a hang).
            results = await asyncio.gather(*long_streams)
            assert results == [(1000, "length", "")] * 6, results
            assert "resuming 2 requests" in log.read_text()
            assert (await stream(client, "after the loss", 5)) == (5, "length", "")

            started = [asyncio.Event() for _ in range(4)]
            draining = [asyncio.create_task(stream(client, f"drain {i}", 300, started[i])) for i in range(4)]
            await all_set(started)
            engines[1].send_signal(signal.SIGTERM)
            assert all(r == (300, "length", "") for r in await asyncio.gather(*draining))
            assert engines[1].wait(30) == 0
            assert (await stream(client, "after the drain", 5)) == (5, "length", "")
        wait_logged(log, " left (1 serving)")
    finally:
        for engine in engines:
            if engine.poll() is None:
                engine.kill()
            engine.wait()


async def test_an_engine_silent_past_the_heartbeat_timeout_rejoins_once_and_serves(
    gateway: tuple[ServerProcess, str, Path], tiny_model_dir: Path
) -> None:
    # NOTE: a stopped process (SIGSTOP) is a busy machine's starved engine, taken for lost. Back, it
    # beats from the same socket identity it joined from: once registered again, those beats must keep
    # that registration alive (they refreshed the lost one, so it joined anew at every beat, forever).
    server, engine_address, log = gateway
    engine = start_engine(tiny_model_dir, engine_address)
    try:
        wait_joined(log, 1)
        engine.send_signal(signal.SIGSTOP)
        wait_logged(log, "engine 0 lost: no heartbeat")
        engine.send_signal(signal.SIGCONT)
        wait_joined(log, 2)
        time.sleep(3)  # NOTE: past the 2 s heartbeat timeout, beating all along
        assert log.read_text().count(" joined from ") == 2
        assert log.read_text().count(" lost: ") == 1
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
            assert (await stream(client, "back", 5)) == (5, "length", "")
    finally:
        if engine.poll() is None:
            engine.kill()
        engine.wait()


async def test_after_the_last_engine_leaves_the_gateway_waits_for_another(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZEROSERVE_STATS_LOG_INTERVAL", "0.2")
    engine_address = f"tcp://127.0.0.1:{free_engine_port()}"
    log = tmp_path / "gateway.log"
    engines = []
    with running_server(
        tiny_model_dir, "--data-parallel-size", "0", "--engine-address", engine_address, *ENGINE_FLAGS,
        log_file=log, wait_healthy=False,
    ) as server:
        try:
            engines.append(start_engine(tiny_model_dir, engine_address))
            wait_joined(log, 1)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
                started = asyncio.Event()
                streamed = asyncio.create_task(stream(client, "before", 300, started))
                await all_set([started])
                engines[0].send_signal(signal.SIGTERM)
                assert await streamed == (300, "length", "")
                assert engines[0].wait(30) == 0
                wait_logged(log, " left (waiting for an engine)")
                health = await client.get("/health")
                assert (health.status_code, health.json()) == (503, {"status": "waiting_for_engine"})
                refused = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1})
                assert refused.status_code == 503 and "no engine" in refused.json()["error"]["message"]
                await asyncio.sleep(1.0)
                after_leaving = log.read_text().split(" left (waiting for an engine)", 1)[1]
                assert "Engine 000:" not in after_leaving
                engines.append(start_engine(tiny_model_dir, engine_address))
                wait_joined(log, 2)
                assert (await client.get("/health")).status_code == 200
                assert (await stream(client, "after", 5)) == (5, "length", "")
        finally:
            for engine in engines:
                if engine.poll() is None:
                    engine.kill()
                engine.wait()


async def test_a_gateway_of_remote_engines_waits_for_its_first_however_long_it_takes_to_load(tiny_model_dir: Path) -> None:
    # NOTE: an engine process takes seconds to start, a thousand times the wait a local engine gets
    # here: one that loads slowly (an emulated CPU, a busy host) still joins, and the gateway serves.
    engine_address = f"tcp://127.0.0.1:{free_engine_port()}"
    config = EngineConfig(model_path=str(tiny_model_dir), model_name=resolve_model(str(tiny_model_dir)).name)
    client = AsyncMPClient(config, data_parallel_size=0, link=LinkSettings(engine_address=engine_address))
    engine = start_engine(tiny_model_dir, engine_address)
    try:
        ready = await client.wait_ready(timeout=0.005)
        assert [e.index for e in client.alive_engines] == [0] and ready.max_model_len == 1024
    finally:
        client.shutdown()
        engine.kill()
        engine.wait()


def test_a_refused_engine_exits_1_saying_why_and_the_gateway_logs_it(
    gateway: tuple[ServerProcess, str, Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    server, engine_address, log = gateway
    other_model = tmp_path / "another-model"
    shutil.copytree(tiny_model_dir, other_model)
    engine = subprocess.run(
        [sys.executable, "-m", "service", "engine", str(other_model), "--gateway", engine_address, *ENGINE_FLAGS],
        capture_output=True, text=True, timeout=120,
    )
    assert engine.returncode == 1
    assert "refused this engine: it serves 'another-model'" in engine.stderr
    assert "Traceback" not in engine.stderr and "Exception in thread" not in engine.stderr, engine.stderr
    assert "refused engine" in log.read_text() and "another-model" in log.read_text()


def test_an_engine_with_an_unauthorised_key_is_refused_and_both_sides_say_so(tiny_model_dir: Path, tmp_path: Path) -> None:
    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    for name in ("gateway", "engine-a", "rogue"):
        subprocess.run(
            [sys.executable, "-m", "service", "keys", "generate", "--dir", str(keys), "--name", name],
            check=True, capture_output=True,
        )
    authorized.mkdir()
    shutil.copy(keys / "engine-a.key", authorized)
    engine_address = f"tcp://127.0.0.1:{free_engine_port()}"
    log = tmp_path / "gateway.log"
    with running_server(
        tiny_model_dir, "--data-parallel-size", "0", "--engine-address", engine_address, "--curve-secret-key",
        str(keys / "gateway.key_secret"), "--curve-authorized-keys", str(authorized), *ENGINE_FLAGS,
        log_file=log, wait_healthy=False,
    ):
        rogue = subprocess.run(
            [
                sys.executable, "-m", "service", "engine", str(tiny_model_dir), "--gateway", engine_address,
                "--curve-secret-key", str(keys / "rogue.key_secret"), "--gateway-public-key", str(keys / "gateway.key"),
                "--accept-timeout", "3", *ENGINE_FLAGS,
            ],
            capture_output=True, text=True, timeout=120,
        )
        assert rogue.returncode == 1 and "did not accept this engine" in rogue.stderr
        assert "Traceback" not in rogue.stderr and "Exception in thread" not in rogue.stderr, rogue.stderr
        rogue_key = (keys / "rogue.key").read_text().split('public-key = "')[1].split('"')[0]
        refusals = [line for line in log.read_text().splitlines() if "refused an engine" in line]
        assert len(refusals) == 1 and rogue_key in refusals[0], refusals
