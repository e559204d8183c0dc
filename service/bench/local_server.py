"""`zeroserve serve` in a child process on a free loopback port: started, ready, stopped (for
benchmarks, and for the tests that speak HTTP to a real server)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


@dataclass
class ServerProcess:
    """A running gateway (and its engine children)."""

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
def local_server(
    serve_args: Sequence[str], *, timeout_s: float = 300.0, log_file: Path | None = None,
    wait_healthy: bool = True, stop_timeout_s: float = 30.0, cwd: Path | None = None,
) -> Iterator[ServerProcess]:
    """Runs `zeroserve serve SERVE_ARGS --port PORT`; yields it once /health answers 200 (with
    `wait_healthy` False, once it answers HTTP at all, while the model loads). Its stdout and
    stderr go to `log_file` when given, else to ours. On leaving: SIGTERM, and SIGKILL if it has
    not exited after `stop_timeout_s`. With `cwd`, the server is the checkout there (`python -m service` runs
    the package of its working folder)."""
    port = free_port()
    command = [sys.executable, "-m", "service", "serve", *serve_args, "--port", str(port)]
    log = None if log_file is None else log_file.open("wb")
    # NOTE: the leader of a process group of its own, as a shell starts a command: a signal to
    # that group reaches the server and never this process.
    proc = subprocess.Popen(
        command, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=None if log is None else subprocess.STDOUT,
        start_new_session=True, cwd=cwd,
    )
    server = ServerProcess(proc, f"http://127.0.0.1:{port}")
    try:
        _wait_ready(server, timeout_s, wait_healthy)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(stop_timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log is not None:
            log.close()


def _wait_ready(server: ServerProcess, timeout_s: float, wait_healthy: bool) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with code {server.proc.returncode} before it was ready")
        try:
            if httpx.get(f"{server.base_url}/health", timeout=1.0).status_code == 200 or not wait_healthy:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("server did not become healthy")
        time.sleep(0.2)
