"""POST /v1/responses: OpenAI's Responses API, stateless, answered as the chat request it converts to."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.chat_completions import chat_chunks
from service.api.disconnect import unless_disconnected
from service.api.errors import parse_body
from service.api.server_state import ServerState
from service.api.sse import resumed_stream, sse_response
from service.frontend.outputs import collect
from service.openai.answer import ChoiceAnswer
from service.openai.request_fields import chat_prompt, now
from service.openai.responses import chat_completion_body
from service.openai.responses_output import ResponseEvents, new_item_id, response_base, whole_response
from service.openai.responses_request import ResponsesRequest, responses_params


async def create_response(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, ResponsesRequest, state.max_request_body_bytes)
    resumed = resumed_stream(request)
    if resumed is not None:
        return resumed  # NOTE: the same request again (its X-Request-Id): the stream it started
    model = state.model_name(body.model)
    body.check_supported()
    chat = body.to_chat_request()
    with responses_params():
        chat.check_supported()
        prompt = chat_prompt(chat, state.llm.input_processor)
        params = await state.sampling_params(chat, [prompt])
        response_id = new_item_id("resp") if body.request_id is None else f"resp_{body.request_id}"
        # NOTE: engine request ids stay unique when two bodies name the same request_id.
        outputs = await state.generate(new_item_id(response_id), [prompt], params, chat)
    created_at = now()
    base = response_base(body, response_id, model, created_at)
    header = {"id": response_id, "created": created_at, "model": model}  # NOTE: the chat answer's, converted
    tokenizer = state.llm.tokenizer

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text))

    if body.stream:
        answer = ChoiceAnswer(chat, state.tool_call_parser, state.reasoning_parser)
        chunks = chat_chunks(outputs, header, tokenizer, len(prompt.token_ids), {}, chat, [answer])
        return sse_response(request, _events(chunks, ResponseEvents(base, count_tokens)), response_id, is_named=True)
    (output,) = await unless_disconnected(request, collect(outputs, 1, 1))
    whole = chat_completion_body(header, output, tokenizer, chat, state.tool_call_parser, state.reasoning_parser)
    return JSONResponse(whole_response(base, whole, count_tokens))


async def _events(chunks: AsyncIterator[dict[str, Any]], events: ResponseEvents) -> AsyncIterator[dict[str, Any]]:
    for event in events.opening():
        yield event
    async for chunk in chunks:
        for event in events.feed(chunk):
            yield event
    for event in events.closing():
        yield event
