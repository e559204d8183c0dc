"""The HTTP tests' servers (tests/service/api, its pages in tests/service/api/web): the real app in process on
a fake engine (`api`, `serve`), and one tiny-model server process (`tiny_server`, `sdk`) for what
needs a real engine."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from service.config import GatewayConfig
from service.model_files.tokenizer import Tokenizer
from service.serving.gateway import Gateway
from tests.server_process import ServerProcess, running_server
from tests.service.api.fake_engine import FakeEngineClient

SERVED_MODEL_NAMES = ("fake", "fake-alias")
# NOTE: a request to the app in process that takes longer has hung: the test fails instead.
REQUEST_TIMEOUT_S = 10.0

Serve = Callable[..., contextlib.AbstractAsyncContextManager[httpx.AsyncClient]]
StreamEvents = Callable[[httpx.AsyncClient, str, dict[str, Any]], Awaitable[list[Any]]]


class _TimedASGITransport(httpx.ASGITransport):
    """ASGI transport whose requests raise TimeoutError after REQUEST_TIMEOUT_S."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            return await super().handle_async_request(request)


@pytest.fixture(scope="session")
def tokenizer(default_model_path: Path) -> Tokenizer:
    return Tokenizer.from_model(default_model_path)


@pytest.fixture
def engine(tokenizer: Tokenizer) -> FakeEngineClient:
    return FakeEngineClient(tokenizer)


@pytest.fixture
def serve(engine: FakeEngineClient, tokenizer: Tokenizer) -> Serve:
    """Opens a client of the app `zeroserve serve` builds (service/serving/gateway.py), in process on
    `engine`; keyword arguments are GatewayConfig's (api_keys, request_timeout_s, ...). One at a
    time: two apps on one engine would take each other's outputs."""

    @contextlib.asynccontextmanager
    async def open_client(**config_changes: Any) -> AsyncIterator[httpx.AsyncClient]:
        config = GatewayConfig(model="fake", **{
            "served_model_names": SERVED_MODEL_NAMES, "responses_store": os.environ["ZEROSERVE_RESPONSES_STORE"],
            **config_changes,
        })
        gateway = Gateway(config)
        llm = gateway.serve_with(engine, tokenizer, engine.ready, "fake", stats_log_interval_s=0)
        app, streams = gateway.app, gateway.streams
        # NOTE: hypercorn answers an exception the app re-raises with the 500 already sent; so does this.
        transport = _TimedASGITransport(app, raise_app_exceptions=False)
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client
        finally:
            await streams.close()
            llm.shutdown()

    return open_client


@pytest.fixture
async def api(serve: Serve) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the app in process, serving "fake" and "fake-alias" on the fake engine."""
    async with serve() as client:
        yield client


@pytest.fixture
def stream_events() -> StreamEvents:
    """POSTs a streamed request with a client and returns its `data:` payloads decoded ("[DONE]"
    kept as a string), checking the SSE framing: every event is its `id:` line (0, 1, ...) and one
    `data:` line."""

    async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> list[Any]:
        response = await client.post(path, json={**body, "stream": True})
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.text.endswith("\n\n")
        events: list[Any] = []
        for event_id, event in enumerate(response.text.split("\n\n")[:-1]):
            id_line, data_line = event.split("\n")
            assert id_line == f"id: {event_id}" and data_line.startswith("data: "), event
            data = data_line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
        return events

    return post


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """One tiny-model server process for this folder's tests (starting one costs seconds)."""
    with running_server(tiny_model_dir, "--served-model-name", "tiny", "tiny-alias") as server:
        yield server


@pytest.fixture
def sdk(tiny_server: ServerProcess) -> Iterator[openai.OpenAI]:
    """The official OpenAI client, pointed at the tiny-model server (closed after the test: its kept
    connection would otherwise be collected, and warned of, in another test)."""
    with openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield client
