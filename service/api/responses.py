"""POST /v1/responses: OpenAI's Responses API, stateless, answered as the chat request it converts to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.admission import Admission
from service.api.disconnect import unless_disconnected
from service.api.errors import parse_body
from service.api.server_state import ServerState
from service.api.sse import sse_response
from service.frontend.outputs import collect
from service.openai.prepare import Preparer
from service.openai.response_bodies import ChatResponse
from service.openai.responses_output import ResponseEvents, new_item_id, response_base, whole_response
from service.openai.responses_request import ResponsesRequest, responses_params


async def create_response(request: Request) -> Response:
    """In order (a re-sent request resumes its stream instead: `resumable`): the body is read, converted to
    a chat request and prepared as one (errors name the Responses fields), sent to the engine, and
    the chat answer goes back converted: a Response whole, or its named events."""
    state: ServerState = request.app.state.server
    preparer: Preparer = state.preparer
    admission: Admission = state.admission
    body = await parse_body(request, ResponsesRequest, state.max_request_body_bytes)
    body.check_supported()
    chat = body.to_chat_request()
    response_id = new_item_id("resp") if body.request_id is None else f"resp_{body.request_id}"
    with responses_params():
        # NOTE: engine request ids stay unique when two bodies name the same request_id.
        prepared = await preparer.prepare(chat, ids=(response_id, new_item_id(response_id)))
        engine_outputs = state.llm.generate(prepared.engine_requests, prepared.params)
        outputs = await admission.guarded(engine_outputs, prepared)
    tokenizer = state.llm.tokenizer
    response = ChatResponse(prepared, chat, tokenizer, state.tool_call_parser, state.reasoning_parser)
    base = response_base(body, response_id, prepared.model, response.created)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text))

    if body.stream:
        events = _events(response.chunks(outputs), ResponseEvents(base, count_tokens))
        return sse_response(request, events, response_id, is_named=True)
    (output,) = await unless_disconnected(request, collect(outputs, 1, 1))
    return JSONResponse(whole_response(base, response.whole(output), count_tokens))


async def _events(chunks: AsyncIterator[dict[str, Any]], events: ResponseEvents) -> AsyncIterator[dict[str, Any]]:
    for event in events.opening():
        yield event
    async for chunk in chunks:
        for event in events.feed(chunk):
            yield event
    for event in events.closing():
        yield event
