"""Runs `zeroserve serve` as a real process on a free port (service/bench/local_server.py), sized
small for tests that speak HTTP to it, and kills its engines as chaos tests do."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import httpx

from service.bench.local_server import ServerProcess, free_port, local_server

__all__ = [
    "ServerProcess", "free_engine_port", "free_port", "is_healthy", "kill_engines", "running_server", "wait_healthy",
]

TEST_SIZES = ("--num-threads", "1", "--kv-cache-memory", "0.25", "--max-model-len", "2048")
# NOTE: waits follow readiness (/health polled); this only bounds a server that never gets there,
# generously, since a shared CI machine may run several times slower than a quiet one.
READY_TIMEOUT_S = 600.0


def running_server(
    model: str | Path, *args: str, timeout: float = READY_TIMEOUT_S, log_file: Path | None = None,
    wait_healthy: bool = True,
) -> AbstractContextManager[ServerProcess]:
    """The server's stdout and stderr go to `log_file` when given, else to the test's own. It is
    yielded once /health answers 200, or with `wait_healthy` False as soon as it answers HTTP at all
    (while the model loads)."""
    return local_server(
        [str(model), *TEST_SIZES, *args], timeout_s=timeout, log_file=log_file, wait_healthy=wait_healthy,
        stop_timeout_s=15.0,
    )


def free_engine_port() -> int:
    """A free port whose next one is free too: an `--engine-address` takes PORT and PORT + 1."""
    while True:
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            try:
                second.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


def is_healthy(server: ServerProcess) -> bool:
    """Whether /health answers 200 now; a refused connection or a slow answer is a no, not an error."""
    try:
        return httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    except httpx.TransportError:
        return False


async def wait_healthy(server: ServerProcess, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Returns once the server's /health answers 200 (a refused connection or a slow answer is
    polled again); fails if the server exits or `timeout_s` passes first."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient(base_url=server.base_url, timeout=10) as client:
        while True:
            try:
                if (await client.get("/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert server.proc.poll() is None, f"the server exited ({server.proc.returncode}) before /health said 200"
            assert asyncio.get_running_loop().time() < deadline, f"/health did not say 200 within {timeout_s:g} s"
            await asyncio.sleep(0.05)


async def kill_engines(
    server: ServerProcess, num_kills: int, rng: random.Random, is_under_way: Callable[[], bool] = lambda: True,
    delay_s: tuple[float, float] = (0.2, 0.6),
) -> list[int]:
    """SIGKILLs a serving engine `num_kills` times, each a random `delay_s` after the gateway is healthy
    again and then as soon as `is_under_way()` says the streams are (so a kill never lands on an
    engine whose streams have all ended); returns the pids killed."""
    killed = []
    for _ in range(num_kills):
        await wait_healthy(server)
        await asyncio.sleep(rng.uniform(*delay_s))
        deadline = asyncio.get_running_loop().time() + 60
        while not is_under_way():
            assert asyncio.get_running_loop().time() < deadline, "the streams were never under way at a kill"
            await asyncio.sleep(0.005)
        pid = rng.choice(server.engine_pids())
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    return killed
