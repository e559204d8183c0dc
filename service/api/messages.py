"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API, answered as the chat
request each body converts to (errors in Anthropic's shape: service/anthropic/errors.py)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.anthropic.chat_request import to_chat_request
from service.anthropic.message import message_base, new_message_id
from service.anthropic.message_events import MessageEvents, message_events
from service.anthropic.protocol import CountTokensRequest, MessagesRequest
from service.api.admission import Admission
from service.api.disconnect import unless_disconnected
from service.api.errors import parse_body
from service.api.gateway_state import ServerState, server_state
from service.api.sse import sse_response
from service.openai.prepare import Preparer
from service.openai.response_bodies import ChatResponse


async def create_message(request: Request) -> Response:
    """In order (a re-sent request resumes its stream instead: `resumable`): the body is read, converted to
    a chat request and prepared as one (errors name the Messages fields), sent to the engine, and the
    chat answer goes back converted: a Message whole, or its named events."""
    state: ServerState = server_state(request)
    preparer: Preparer = state.preparer
    admission: Admission = state.admission
    body = await parse_body(request, MessagesRequest, state.max_request_body_bytes)
    body.check_supported()
    chat = to_chat_request(body)
    message_id = new_message_id()
    prepared = await preparer.prepare(chat, ids=(message_id, message_id))
    engine_outputs = state.llm.generate(prepared.engine_requests, prepared.params)
    outputs = await admission.guarded(engine_outputs, prepared)
    response = ChatResponse(prepared, chat, state.llm.tokenizer, state.tool_call_parser, state.reasoning_parser)
    events = MessageEvents(message_base(message_id, prepared.model), prepared.num_prompt_tokens)
    if body.stream:
        return sse_response(request, state.gateway, message_events(response.steps(outputs), events), message_id,
                            is_named=True)
    return JSONResponse(await unless_disconnected(request, events.answer(response.steps(outputs))))


async def count_message_tokens(request: Request) -> Response:
    """{"input_tokens": N}: the prompt tokens the same body's message would be charged, prepared as it
    would be (rendered by the chat template with its tools), not sent."""
    state: ServerState = server_state(request)
    body = await parse_body(request, CountTokensRequest, state.max_request_body_bytes)
    body.check_supported()
    message_id = new_message_id()
    prepared = await state.preparer.prepare(to_chat_request(body), ids=(message_id, message_id))
    return JSONResponse({"input_tokens": prepared.num_prompt_tokens})
