"""The start-up order of pods on Kubernetes (deploy/k8s/), as separate processes: an engine pod
that starts before its gateway waits for it and joins it, and joins it again after the gateway is
restarted, while the gateway's /livez stays 200 and its /health turns 200 once the engine serves."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, free_engine_port, running_server, wait_healthy

ENGINE_FLAGS = ["--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "1024"]


@pytest.fixture
def engine_address() -> str:
    return f"tcp://127.0.0.1:{free_engine_port()}"


@pytest.fixture
def engine(tiny_model_dir: Path, engine_address: str, tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """An engine pod: started first, it waits for a gateway at `engine_address` (as long as k8s/ gives it)."""
    with (tmp_path / "engine.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", "engine", str(tiny_model_dir), "--gateway", engine_address,
             "--accept-timeout", "300", *ENGINE_FLAGS],
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def serves(gateway: ServerProcess) -> str:
    """A completion through the gateway, with the engine it was served by."""
    await wait_healthy(gateway)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as client:
        response = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"]
    return response.text


def test_an_engine_started_first_joins_the_gateway_started_later_and_again_after_its_restart(
    tiny_model_dir: Path, engine_address: str, engine: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    gateway_args = ("--data-parallel-size", "0", "--engine-address", engine_address.replace("127.0.0.1", "0.0.0.0"),
                    *ENGINE_FLAGS)
    for start in ("first", "restarted"):
        log = tmp_path / f"gateway-{start}.log"
        with running_server(tiny_model_dir, *gateway_args, log_file=log, wait_healthy=False) as gateway:
            # NOTE: the liveness probe's route answers from the first moment, engine or not.
            assert httpx.get(f"{gateway.base_url}/livez", timeout=10).status_code == 200
            asyncio.run(serves(gateway))
            assert httpx.get(f"{gateway.base_url}/livez", timeout=10).status_code == 200
        assert gateway.proc.returncode is not None
        assert " joined from " in log.read_text(), f"the engine never joined the {start} gateway"
        assert engine.poll() is None, "the engine must outlive its gateway"
