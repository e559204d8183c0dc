"""What another site's page may send a server without a key, in process: the POSTs a browser sends from
any page without asking first (a form, plain text) get 403 on a multi-model server's uploads, loads and
unloads and its generation routes, before any model loads; a body that is not JSON gets 415 before any
work; this server's own pages and --allowed-origins pass."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.config import GatewayConfig
from service.models.catalog import ModelEntry
from service.models.model_pool import ModelPool
from service.serving.gateway import Gateway
from tests.service.api.openai_error import assert_openai_error
from tests.service.conftest import Serve

EVIL = "http://evil.example"
SERVER = "http://127.0.0.1:8000"
CHAT = "/v1/chat/completions"
CHAT_BODY = b'{"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}'
# NOTE: what a page of any site may send without a preflight: `fetch(url, {method: "POST", body: text})`
# declares text/plain, a submitted <form> multipart/form-data or urlencoded.
PLAIN = {"content-type": "text/plain;charset=UTF-8"}


@pytest.fixture
async def pool_server(tmp_path: Path) -> AsyncIterator[tuple[httpx.AsyncClient, ModelPool]]:
    """A keyless server of two models, alpha and beta, none loaded (a load of either would fail: it has no
    file), in process."""
    config = GatewayConfig(model="alpha", models=("alpha", "beta"), responses_store=str(tmp_path / "store.sqlite"))
    gateway = Gateway(config)
    entries = [ModelEntry(name, (), GatewayConfig(model=name), {}, None) for name in ("alpha", "beta")]
    pool = ModelPool(entries, config, gateway.model_state)
    gateway.serve_models(pool)
    transport = httpx.ASGITransport(gateway.app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url=SERVER) as client:
            yield client, pool
    finally:
        await pool.close()


def statuses(pool: ModelPool) -> dict[str, str]:
    return {slot.id: slot.status.value for slot in pool.slots.values()}


def assert_refused_origin(response: httpx.Response) -> None:
    error = assert_openai_error(response, 403)
    assert error["code"] == "origin_not_allowed"
    assert EVIL in error["message"] and "--allowed-origins" in error["message"]


async def test_another_sites_page_cannot_upload_load_unload_or_generate(
    pool_server: tuple[httpx.AsyncClient, ModelPool],
) -> None:
    client, pool = pool_server
    origin = {"origin": EVIL}
    upload = await client.post(
        "/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"}, headers=origin
    )
    assert_refused_origin(upload)
    for path in ("/models/load", "/models/unload"):
        assert_refused_origin(await client.post(path, content=b'{"model": "alpha"}', headers=origin | PLAIN))
        assert_refused_origin(await client.post(path, content=b'{"model": "alpha"}', headers=origin))
    assert_refused_origin(await client.post("/v1/models/alpha/load", headers=origin))
    for path in (CHAT, "/v1/completions", "/v1/responses", "/v1/messages", "/tokenize"):
        assert (await client.post(path, content=CHAT_BODY, headers=origin | PLAIN)).status_code == 403
    assert (await client.delete("/v1/files/file-1", headers=origin)).status_code == 403
    anthropic = await client.post("/v1/messages", content=CHAT_BODY, headers=origin | {"content-type": "application/json"})
    assert anthropic.json()["error"]["type"] == "permission_error" and EVIL in anthropic.json()["error"]["message"]

    assert (await client.get("/v1/files")).json()["data"] == []
    assert statuses(pool) == {"alpha": "unloaded", "beta": "unloaded"}


async def test_a_body_that_is_not_json_is_a_415_before_any_model_loads(
    pool_server: tuple[httpx.AsyncClient, ModelPool],
) -> None:
    client, pool = pool_server
    for path in (CHAT, "/models/load"):
        error = assert_openai_error(await client.post(path, content=CHAT_BODY, headers=PLAIN), 415)
        assert "Content-Type: application/json" in error["message"]
    # NOTE: what `curl -d` sends without -H.
    form = {"content-type": "application/x-www-form-urlencoded"}
    assert_openai_error(await client.post("/models/unload", content=b'{"model": "alpha"}', headers=form), 415)
    assert statuses(pool) == {"alpha": "unloaded", "beta": "unloaded"}


async def test_this_servers_own_pages_and_clients_without_an_origin_pass(
    pool_server: tuple[httpx.AsyncClient, ModelPool],
) -> None:
    client, pool = pool_server
    for origin in ({"origin": SERVER}, {"origin": "HTTP://127.0.0.1:8000"}, {}):
        unload = await client.post("/models/unload", json={"model": "beta"}, headers=origin)
        assert unload.status_code == 200, unload.text
    upload = await client.post(
        "/v1/files", files={"file": ("in.jsonl", b"{}\n")}, data={"purpose": "batch"}, headers={"origin": SERVER}
    )
    assert upload.status_code == 200, upload.text
    # NOTE: the same host on another port, or over https, is another site.
    for other in ("http://127.0.0.1:3000", "https://127.0.0.1:8000", "null"):
        assert (await client.post("/models/unload", json={"model": "beta"}, headers={"origin": other})).status_code == 403


async def chat(client: httpx.AsyncClient, origin: str, **headers: str) -> httpx.Response:
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return await client.post(CHAT, json=body, headers={"origin": origin, **headers})


@pytest.mark.parametrize("allowed", [("http://app.example",), ("http://other.example,http://app.example",)])
async def test_allowed_origins_let_a_listed_sites_pages_in_with_cors(serve: Serve, allowed: tuple[str, ...]) -> None:
    async with serve(allowed_origins=allowed) as client:
        preflight = await client.options(CHAT, headers={
            "origin": "http://app.example", "access-control-request-method": "POST",
            "access-control-request-headers": "content-type,authorization",
        })
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://app.example"
        answer = await chat(client, "http://app.example")
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == "http://app.example"
        assert_refused_origin(await chat(client, EVIL))


async def test_a_star_lets_every_site_in_and_a_key_does_not_open_the_door(serve: Serve) -> None:
    async with serve(allowed_origins=("*",)) as client:
        assert (await chat(client, EVIL)).status_code == 200
    async with serve(api_keys=("sekrit",)) as client:
        assert_refused_origin(await chat(client, EVIL, authorization="Bearer sekrit"))
        assert (await chat(client, "http://test", authorization="Bearer sekrit")).status_code == 200


def test_an_allowed_origin_must_be_an_origin() -> None:
    with pytest.raises(ValueError, match="--allowed-origins"):
        GatewayConfig(model="fake", allowed_origins=("http://app.example/path",))
