"""`zeroserve serve --api-server-count 2`: two gateway processes on one port, one shared engine."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import httpx

from tests.server_process import running_server
from tests.service.load_client import complete, prompts


async def test_both_gateway_processes_serve_requests_on_one_port(tiny_model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with running_server(
        tiny_model_dir, "--api-server-count", "2", "--kv-cache-memory", "0.05", log_file=log
    ) as server:
        # NOTE: a new connection per request, so the kernel picks a process each time.
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
            results = await asyncio.gather(*(complete(client, p, 6) for p in prompts(40, "two-gateways")))
        assert [r["status"] for r in results] == [200] * 40
        assert all(r["finish_reason"] == "length" for r in results)
        # NOTE: each request's log line follows its response (a while later on a busy machine).
        deadline = time.monotonic() + 120
        while len(finished_by := re.findall(r"api-server-(\d) zeroserve\.request INFO request", log.read_text())) < 40:
            assert time.monotonic() < deadline, finished_by
            await asyncio.sleep(0.05)
        assert len(finished_by) == 40
        assert set(finished_by) == {"0", "1"}, finished_by

        # NOTE: the shared engine killed under load: started again, it rejoins both gateways,
        # which resume their requests there.
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
            undisturbed = await asyncio.gather(*(complete(client, p, 300) for p in prompts(8, "long")))
            running = asyncio.gather(*(complete(client, p, 300) for p in prompts(8, "long")))
            await asyncio.sleep(0.5)
            (engine_pid,) = [pid for pid in server.engine_pids() if b"engine_proc" in Path(f"/proc/{pid}/cmdline").read_bytes()]
            os.kill(engine_pid, signal.SIGKILL)
            assert await running == undisturbed
        assert "engine 0: starting a new engine process (restart 1)" in log.read_text()
    assert server.proc.returncode == 0
