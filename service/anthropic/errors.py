"""Errors in Anthropic's shape on the Messages routes: {"type": "error", "error": {"type", "message"}},
typed by status as Anthropic types them, an overloaded server's 503 sent as Anthropic's 529. Every
error answer on those paths (the route's, the API key's, admission's, an unexpected failure's) is
rewritten on its way out, so no code that answers errors needs to know which API asked."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

# Anthropic's error type of each status it answers with.
ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error", 503: "overloaded_error",
    504: "timeout_error", 529: "overloaded_error",
}


# NOTE: Anthropic answers "overloaded" (engine not ready, too many requests queued) with its own 529.
ANTHROPIC_STATUSES = {503: 529}


def is_anthropic_path(path: str, paths: Iterable[str]) -> bool:
    """Whether `path` is one of the Messages routes' `paths` or under one (an unknown path there is Anthropic's 404)."""
    return any(path == route or path.startswith(route + "/") for route in paths)


def anthropic_error_type(status_code: int) -> str:
    return ERROR_TYPES.get(status_code, "invalid_request_error" if status_code < 500 else "api_error")


def anthropic_error_body(status_code: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": anthropic_error_type(status_code), "message": message}}


def _message_of(status_code: int, body: bytes) -> str:
    """The message an error answer's body carries (OpenAI's shape), or its status's phrase."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    try:
        return HTTPStatus(status_code).phrase
    except ValueError:
        return f"Error {status_code}"


class AnthropicErrorsMiddleware:
    """Rewrites error answers on the Messages routes (`paths`, and those under them) into Anthropic's shape."""

    def __init__(self, app: ASGIApp, paths: Iterable[str]) -> None:
        self.app = app
        self.paths = tuple(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not is_anthropic_path(path, self.paths):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body_parts: list[bytes] = []
        is_started = False

        async def send_shaped(message: Message) -> None:
            nonlocal start, is_started
            if message["type"] == "http.response.start":
                is_started = True
                if message["status"] >= 400:
                    start = message
                    return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            body_parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                status_code: int = ANTHROPIC_STATUSES.get(start["status"]) or start["status"]
                await _send_error(send, status_code, _message_of(start["status"], b"".join(body_parts)),
                                  [(k, v) for k, v in start["headers"] if k.lower() not in _REPLACED_HEADERS])

        try:
            await self.app(scope, receive, send_shaped)
        except Exception as exc:
            # NOTE: Starlette answers an unexpected error outside every middleware; here it is answered as Anthropic's.
            if is_started:
                raise
            logger.exception("unexpected error on %s", path, exc_info=exc)
            await _send_error(send, 500, f"Internal error: {exc}", [])


_REPLACED_HEADERS = {b"content-length", b"content-type"}


async def _send_error(send: Send, status_code: int, message: str, headers: list[tuple[bytes, bytes]]) -> None:
    body = json.dumps(anthropic_error_body(status_code, message)).encode()
    headers = [*headers, (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
