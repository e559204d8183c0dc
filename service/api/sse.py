"""Server-sent events: OpenAI chunk objects, an error event on failure, then [DONE]."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from sse_starlette.event import ServerSentEvent
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message, Send

from service.api.gateway_state import GatewayState, gateway_of
from service.config import GatewayConfig
from service.openai.errors import APIError

logger = logging.getLogger(__name__)

DEFAULT_SSE_KEEPALIVE_S: float = GatewayConfig.sse_keepalive_s  # the setting's default, declared there


async def _events(chunks: AsyncIterator[dict[str, Any]], is_named: bool) -> AsyncIterator[bytes]:
    """Each chunk as an event with its `id:` (0, 1, ...), which a client names in Last-Event-ID to resume;
    a failure ends the stream with an error event, and an unnamed stream ends with [DONE]."""
    event_id = -1

    def numbered(event: bytes) -> bytes:
        nonlocal event_id
        event_id += 1
        return b"id: %d\n%s" % (event_id, event)

    try:
        async for chunk in chunks:
            yield numbered(_event(chunk, chunk["type"] if is_named else None))
    except APIError as error:
        yield numbered(_error_event(error, is_named))
    except Exception as error:  # noqa: BLE001 - a stream must end with an error, never hang
        logger.warning("stream ended by error: %s", error)
        yield numbered(_error_event(APIError(str(error), 503, error_type="server_error"), is_named))
    if not is_named:
        yield numbered(_DONE)


def _event(data: dict[str, Any], name: str | None = None) -> bytes:
    """One `data:` event (named by an `event:` line if `name`), encoded once: orjson writes compact
    UTF-8 JSON (no line breaks)."""
    named = b"" if name is None else b"event: " + name.encode() + b"\n"
    return named + b"data: " + orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"


def _error_event(error: APIError, is_named: bool) -> bytes:
    return _event({"type": "error", **error.to_dict()}, "error") if is_named else _event(error.to_dict())


_DONE = b"data: [DONE]\n\n"


class _Keepalive(ServerSentEvent):
    """`: ping`, a comment line with no blank line after it: it adds no event. (After an event
    with an `id:`, OpenAI's Python SDK turns a comment followed by a blank line into an event with
    empty data, which it then fails to parse as JSON.)"""

    def encode(self) -> bytes:
        return b": ping\n"


def _keepalive() -> ServerSentEvent:
    return _Keepalive()


class _EventStream(EventSourceResponse):
    """An SSE response that sends `: ping` every `keepalive_s` seconds (0: never)."""

    def __init__(self, events: AsyncIterator[bytes], stream_id: str, keepalive_s: float) -> None:
        super().__init__(events, sep="\n", ping_message_factory=_keepalive, headers={"X-Request-Id": stream_id})
        self.ping_interval = keepalive_s

    async def _send_with_timeout(self, send: Send, message: Message) -> None:
        # NOTE: with no send timeout, skip the cancel scope sse-starlette opens around every
        # event (a tenth of the gateway's time at 256 streams).
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


def sse_response(
    request: Request, gateway: GatewayState, chunks: AsyncIterator[dict[str, Any]], response_id: str,
    is_named: bool = False,
) -> EventSourceResponse:
    """Streams `chunks` as `data:` events, ending with `data: [DONE]`; `: ping` comments keep
    the connection alive while they wait. With `is_named` (the Responses API) each event is also
    named by its "type" and the stream ends with its last event, as OpenAI's does.

    With --stream-retention the events are kept under `response_id` (and the client's
    X-Request-Id): the request generates on if the client goes, and a reconnect resumes it."""
    stream_id = request.headers.get("x-request-id") or response_id
    events = _events(chunks, is_named)
    store = gateway.streams
    if not store.is_enabled:
        return _EventStream(events, stream_id, gateway.sse_keepalive_s)
    # NOTE: the stream holds the request's admission slot from here (a drain waits for it).
    request.state.is_handed_off = True
    log = store.start(list(dict.fromkeys([stream_id, response_id])), events, gateway.admission.release)
    return _EventStream(log.follow(-1), stream_id, gateway.sse_keepalive_s)


def resumable(route: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """`route`, unless the request names a kept stream by its X-Request-Id (the same request sent
    again after a lost connection): then the stream it started, without reading the body again."""

    async def resumed_or_answered(request: Request) -> Response:
        resumed = resumed_stream(request)
        return resumed if resumed is not None else await route(request)

    return resumed_or_answered


def resumed_stream(request: Request) -> EventSourceResponse | None:
    """The kept stream a re-sent request names by its X-Request-Id, from the event after its
    Last-Event-ID (all of them without one); None when there is no such stream."""
    stream_id = request.headers.get("x-request-id")
    gateway = gateway_of(request.app)
    log = None if stream_id is None else gateway.streams.get(stream_id)
    if log is None or stream_id is None:
        return None
    return _EventStream(log.follow(last_event_id(request)), stream_id, gateway.sse_keepalive_s)


async def get_stream(request: Request) -> Response:
    """GET /v1/streams/{request_id}: a kept stream, from the event after Last-Event-ID."""
    gateway = gateway_of(request.app)
    store = gateway.streams
    stream_id = request.path_params["request_id"]
    if not store.is_enabled:
        raise APIError("Streams are not kept on this server; start it with --stream-retention SECONDS.", 404,
                       error_type="not_found_error", code="stream_not_found")
    log = store.get(stream_id)
    if log is None:
        raise APIError(f"No stream {stream_id!r} is kept here: it never started, or it ended more than "
                       f"{store.retention_s:g} s ago (--stream-retention).", 404, error_type="not_found_error",
                       code="stream_not_found")
    return _EventStream(log.follow(last_event_id(request)), stream_id, gateway.sse_keepalive_s)


async def delete_stream(request: Request) -> Response:
    """DELETE /v1/streams/{request_id}: aborts a kept stream's request now (a client that leaves
    a kept stream otherwise lets it generate on for the window)."""
    store = gateway_of(request.app).streams
    stream_id = request.path_params["request_id"]
    if not store.cancel(stream_id):
        raise APIError(f"No stream {stream_id!r} is kept here.", 404, error_type="not_found_error",
                       code="stream_not_found")
    return JSONResponse({"id": stream_id, "object": "stream", "deleted": True})


def last_event_id(request: Request) -> int:
    """The Last-Event-ID header's event id, or -1 without one."""
    value = request.headers.get("last-event-id")
    if value is None or value == "":
        return -1
    if not (value.isascii() and value.isdigit()):
        raise APIError(f"Last-Event-ID must be an event id this server sent (an integer), got {value!r}.",
                       param="Last-Event-ID", code="invalid_last_event_id")
    return int(value)
