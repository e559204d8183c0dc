"""Error answers under /v1/messages rewritten into Anthropic's shape, whatever answered them; other
paths left as they are."""

from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.anthropic.errors import AnthropicErrorsMiddleware


async def refused(request: Request) -> Response:
    return JSONResponse({"error": {"message": "Slow down.", "type": "x", "param": None, "code": None}}, 429)


async def broken(request: Request) -> Response:
    raise RuntimeError("boom")


async def fine(request: Request) -> Response:
    return JSONResponse({"ok": True})


def client() -> httpx.AsyncClient:
    app = Starlette(middleware=[Middleware(AnthropicErrorsMiddleware, paths=("/v1/messages",))], routes=[
        Route("/v1/messages", refused, methods=["POST"]), Route("/v1/messages/broken", broken),
        Route("/v1/messages/fine", fine), Route("/v1/chat/completions", refused, methods=["POST"]),
    ])
    return httpx.AsyncClient(transport=httpx.ASGITransport(app, raise_app_exceptions=False), base_url="http://test")


async def test_errors_on_messages_paths_are_anthropics_and_others_are_left_alone() -> None:
    async with client() as api:
        limited = await api.post("/v1/messages")
        assert limited.status_code == 429
        assert limited.json() == {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down."}}
        assert int(limited.headers["content-length"]) == len(limited.content)
        failed = await api.get("/v1/messages/broken")
        assert failed.status_code == 500
        assert failed.json() == {"type": "error", "error": {"type": "api_error", "message": "Internal error: boom"}}
        missing = await api.get("/v1/messages/nothing")
        assert missing.json() == {"type": "error", "error": {"type": "not_found_error", "message": "Not Found"}}
        assert (await api.get("/v1/messages/fine")).json() == {"ok": True}
        openai_shaped = await api.post("/v1/chat/completions")
        assert openai_shaped.json()["error"]["message"] == "Slow down." and "type" not in openai_shaped.json()
