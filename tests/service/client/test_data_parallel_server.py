"""`zeroserve serve --data-parallel-size 2`: one port, two engines, the load spread between them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.server_process import running_server
from tests.service.load_client import complete, prompts, served_by_engine


async def test_64_concurrent_requests_spread_over_two_engines(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir, "--data-parallel-size", "2", "--kv-cache-memory", "0.05") as server:
        assert len(server.engine_pids()) == 2
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            results = await asyncio.gather(*(complete(client, p, 12) for p in prompts(64, "dp")))
            served = served_by_engine((await client.get("/metrics")).text)
            bad_rank = await client.post(
                "/v1/completions", json={"prompt": "x", "max_tokens": 2, "data_parallel_rank": 7}
            )
    assert [r["status"] for r in results] == [200] * 64
    assert all(r["finish_reason"] == "length" for r in results)
    assert sum(served.values()) == 64 and set(served) == {"0", "1"}
    assert max(served.values()) <= 0.7 * 64, served
    assert bad_rank.status_code == 400 and "data_parallel_rank" in bad_rank.text
