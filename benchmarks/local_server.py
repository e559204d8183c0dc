"""`zeroserve serve` in a child process for a benchmark: started, healthy, stopped."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx


@contextmanager
def local_server(serve_args: list[str], timeout_s: float = 300) -> Iterator[str]:
    """Runs `zeroserve serve SERVE_ARGS` on a free loopback port; yields its base URL once /health answers."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", *serve_args, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(server, base_url, timeout_s)
        yield base_url
    finally:
        server.terminate()
        server.wait(30)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_healthy(server: subprocess.Popen[bytes], base_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base_url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.5)
