"""A many-model gateway's model routes in process, its models listed and none loaded: /v1/models says a
failed model as llama.cpp's router does and names no folder, and /health/{id} tells why a model failed
only to a caller with the key."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from service.config import GatewayConfig
from service.models.catalog import ModelEntry
from service.models.model_pool import ModelPool
from service.serving.gateway import Gateway

FOLDER = Path("/srv/private/models")
REASON = f"{FOLDER}/broken.gguf: not a GGUF file"


@contextlib.asynccontextmanager
async def many_models(**config_changes: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway serving `ok` (a file never loaded here) and `broken` (listed failed, with its reason)."""
    config = GatewayConfig(model="", models=("ok", "broken"), responses_store="off", **config_changes)
    entries = [
        ModelEntry("ok", ("ok-alias",), config, {}, FOLDER / "ok.gguf"),
        ModelEntry("broken", (), config, {}, FOLDER / "broken.gguf", REASON),
    ]
    gateway = Gateway(config)
    pool = ModelPool(entries, config, gateway.model_state)
    gateway.serve_models(pool)
    try:
        transport = httpx.ASGITransport(gateway.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client
    finally:
        await pool.close()


async def test_a_failed_model_reads_as_llama_cpps_router_says_it_and_no_card_names_a_folder() -> None:
    async with many_models() as client:
        cards = {card["id"]: card for card in (await client.get("/v1/models")).json()["data"]}
    assert cards["broken"]["status"] == {"value": "unloaded", "failed": True, "reason": REASON}
    assert cards["ok"]["status"] == cards["ok-alias"]["status"] == {"value": "unloaded"}
    assert (cards["ok"]["path"], cards["broken"]["path"]) == ("ok.gguf", "broken.gguf")
    assert not any(str(FOLDER) in str(card["path"]) for card in cards.values())


async def test_health_of_a_model_tells_why_it_failed_only_with_the_key() -> None:
    async with many_models(api_keys=("k1",)) as client:
        anyone = await client.get("/health/broken")
        keyed = await client.get("/health/broken", headers={"Authorization": "Bearer k1"})
        wrong = await client.get("/health/broken", headers={"x-api-key": "k2"})
        assert (await client.get("/v1/models")).status_code == 401
    assert (anyone.status_code, anyone.json()) == (503, {"status": "failed"})
    assert (wrong.status_code, wrong.json()) == (503, {"status": "failed"})
    assert (keyed.status_code, keyed.json()) == (503, {"status": "failed", "reason": REASON})
    async with many_models() as keyless:
        assert (await keyless.get("/health/broken")).json() == {"status": "failed", "reason": REASON}
