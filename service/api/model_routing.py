"""A multi-model gateway's routing: the model a request body names is loaded if it is not (a stream
gets SSE keep-alives meanwhile), and its state is what the route reads (`server_state`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.anthropic.errors import anthropic_error_body, is_anthropic_path
from service.api.admission import PathRules
from service.api.errors import check_content_type, error_response
from service.api.gateway_state import STATE_KEY, gateway_of
from service.openai.errors import APIError

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-store"),
    (b"x-accel-buffering", b"no"),
]


class ModelRoutingMiddleware:
    """Hands each routed request the state of the model its body names, once that model is loaded."""

    def __init__(self, app: ASGIApp, rules: PathRules) -> None:
        self.app = app
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pool = gateway_of(scope["app"]).pool if "app" in scope else None
        if pool is None or scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.rules.model_routed:
            await self.app(scope, receive, send)
            return
        try:
            # NOTE: a body that is not JSON is refused before its model loads.
            check_content_type(Headers(scope=scope).get("content-type"))
            body, receive = await _peek(receive, pool.config.max_request_body_bytes)
            fields = _fields(body)
            model, is_stream = fields.get("model"), fields.get("stream") is True
            slot = pool.slot_of(model if isinstance(model, str) else None)
        except APIError as error:
            await error_response(error)(scope, receive, send)
            return
        keepalive_s = gateway_of(scope["app"]).sse_keepalive_s
        is_anthropic = is_anthropic_path(scope["path"], self.rules.anthropic)
        acquiring = asyncio.ensure_future(pool.acquire(slot.id))
        has_started = False
        try:
            if is_stream and keepalive_s > 0:
                while not (await asyncio.wait({acquiring}, timeout=keepalive_s))[0]:
                    # NOTE: the model is still loading: the stream starts now, with a comment each interval.
                    if not has_started:
                        await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
                        has_started = True
                    await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
            try:
                slot, state = await acquiring
            except APIError as error:
                if has_started:
                    await _send_error_event(send, error.status_code, error.to_dict(), is_anthropic)
                else:
                    await error_response(error)(scope, receive, send)
                return
        finally:
            if not acquiring.done():
                acquiring.cancel()
                with contextlib.suppress(BaseException):
                    await acquiring
        try:
            scope[STATE_KEY] = state
            await self.app(scope, receive, _after_start(send, is_anthropic) if has_started else send)
        finally:
            pool.release(slot)


async def _peek(receive: Receive, max_bytes: int) -> tuple[bytes, Receive]:
    """The body (up to `max_bytes`: a larger one is left for the route's 413), and a receive that gives it again."""
    messages: list[Message] = []
    num_bytes = 0
    while num_bytes <= max_bytes:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        num_bytes += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")
    pending = iter(messages)

    async def replay() -> Message:
        return next(pending, None) or await receive()

    return (body if num_bytes <= max_bytes else b""), replay


def _fields(body: bytes) -> dict[str, Any]:
    """The body's top-level fields, or none when it is not a JSON object (the route says why)."""
    try:
        value = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _after_start(send: Send, is_anthropic: bool) -> Send:
    """The route's messages on a stream already started: its own start dropped, an error answer sent as
    an SSE error event (OpenAI's `data: {"error": ...}`, Anthropic's `event: error`)."""
    status = 200
    error_chunks: list[bytes] = []

    async def send_on(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            return
        if status == 200 or message["type"] != "http.response.body":
            await send(message)
            return
        error_chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            await _send_error_event(send, status, _fields(b"".join(error_chunks)), is_anthropic)

    return send_on


async def _send_error_event(send: Send, status_code: int, body: dict[str, Any], is_anthropic: bool) -> None:
    """The stream's last event: the error answer it would have had before it started."""
    if is_anthropic:
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else None
        data = orjson.dumps(anthropic_error_body(status_code, str(message or f"Error {status_code}")))
        frame = b"event: error\ndata: " + data + b"\n\n"
    else:
        frame = b"data: " + orjson.dumps(body) + b"\n\ndata: [DONE]\n\n"
    await send({"type": "http.response.body", "body": frame, "more_body": False})
