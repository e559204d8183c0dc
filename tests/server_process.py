"""Runs `zeroserve serve` as a real process on a free port, for tests that speak HTTP to it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class ServerProcess:
    """A running gateway (and its engine child)."""

    proc: subprocess.Popen[bytes]
    base_url: str

    def engine_pids(self) -> list[int]:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return [int(pid) for pid in children]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_server(
    model: str | Path, *args: str, timeout: float = 180.0, log_file: Path | None = None,
    wait_healthy: bool = True,
) -> Iterator[ServerProcess]:
    """The server's stdout and stderr go to `log_file` when given, else to the test's own. With
    `wait_healthy` False it is yielded as soon as it answers HTTP at all (while the model loads)."""
    port = free_port()
    command = [sys.executable, "-m", "service", "serve", str(model), "--port", str(port)]
    command += ["--num-threads", "1", "--kv-cache-memory", "0.25", "--max-model-len", "2048", *args]
    log = None if log_file is None else log_file.open("wb")
    output = {} if log is None else {"stdout": log, "stderr": subprocess.STDOUT}
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"}, **output)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode} before it was ready")
            try:
                if httpx.get(f"{server.base_url}/health", timeout=1.0).status_code == 200 or not wait_healthy:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("server did not become healthy")
            time.sleep(0.2)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log is not None:
            log.close()
