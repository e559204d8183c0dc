"""Server-sent events: OpenAI chunk objects, an error event on failure, then [DONE]."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.types import Message, Receive, Scope, Send

from service.openai.errors import APIError

logger = logging.getLogger(__name__)

DEFAULT_SSE_KEEPALIVE_S = 15.0


async def _events(chunks: AsyncIterator[dict[str, Any]], is_named: bool) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield _event(chunk, chunk["type"] if is_named else None)
    except APIError as error:
        yield _error_event(error, is_named)
    except Exception as error:  # noqa: BLE001 - a stream must end with an error, never hang
        logger.warning("stream ended by error: %s", error)
        yield _error_event(APIError(str(error), 503, error_type="server_error"), is_named)
    if not is_named:
        yield _DONE


def _event(data: dict[str, Any], name: str | None = None) -> bytes:
    """One `data:` event (named by an `event:` line if `name`), encoded once: orjson writes compact
    UTF-8 JSON (no line breaks)."""
    named = b"" if name is None else b"event: " + name.encode() + b"\n"
    return named + b"data: " + orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"


def _error_event(error: APIError, is_named: bool) -> bytes:
    return _event({"type": "error", **error.to_dict()}, "error") if is_named else _event(error.to_dict())


_DONE = b"data: [DONE]\n\n"


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="ping", sep="\n")


class _EventStream(EventSourceResponse):
    """An SSE response that sends `: ping` every `app.state.sse_keepalive_s` seconds (0: never)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = scope.get("app")
        self.ping_interval = getattr(app.state, "sse_keepalive_s", DEFAULT_SSE_KEEPALIVE_S) if app else 0
        await super().__call__(scope, receive, send)

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        # NOTE: with no send timeout, skip the cancel scope sse-starlette opens around every
        # event (a tenth of the gateway's time at 256 streams).
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


def sse_response(chunks: AsyncIterator[dict[str, Any]], is_named: bool = False) -> EventSourceResponse:
    """Streams `chunks` as `data:` events, ending with `data: [DONE]`; `: ping` comments keep
    the connection alive while they wait. With `is_named` (the Responses API) each event is also
    named by its "type" and the stream ends with its last event, as OpenAI's does."""
    return _EventStream(_events(chunks, is_named), sep="\n", ping_message_factory=_keepalive)
