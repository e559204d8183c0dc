"""/livez (liveness) and /health (readiness) in process: a gateway that loads, waits for an engine or
has lost it is alive but not ready, so a kubelet takes it out of rotation instead of restarting it."""

from __future__ import annotations

import httpx

from service.api.app import create_app
from tests.service.api.fake_engine import FakeEngineClient
from tests.service.conftest import Serve


async def test_a_loading_gateway_is_alive_but_not_ready() -> None:
    transport = httpx.ASGITransport(create_app(None))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        live, health = await client.get("/livez"), await client.get("/health")
    assert (live.status_code, live.json()) == (200, {"status": "alive"})
    assert (health.status_code, health.json()) == (503, {"status": "loading"})


async def test_a_serving_gateway_is_alive_and_ready(api: httpx.AsyncClient) -> None:
    assert (await api.get("/livez")).status_code == 200
    assert (await api.get("/health")).status_code == 200


async def test_a_gateway_whose_engine_died_stays_alive(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    engine.die_after(0)
    await api.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert (await api.get("/health")).status_code == 503
    assert (await api.get("/livez")).status_code == 200


async def test_livez_needs_no_api_key(serve: Serve) -> None:
    async with serve(api_keys=("k1",)) as client:
        assert (await client.get("/livez")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 401
