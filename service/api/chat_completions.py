"""POST /v1/chat/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.disconnect import unless_disconnected
from service.api.errors import parse_body
from service.api.server_state import ServerState
from service.api.sse import resumed_stream, sse_response
from service.frontend.outputs import RequestOutput, collect
from service.model_files.tokenizer import Tokenizer
from service.openai.answer import ChoiceAnswer
from service.openai.logprobs_format import chat_logprobs, prompt_logprobs_list
from service.openai.protocol import ChatCompletionRequest
from service.openai.request_fields import chat_prompt, now, request_ids, usage
from service.openai.responses import chat_completion_body, choice_end


async def create_chat_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, ChatCompletionRequest, state.max_request_body_bytes)
    resumed = resumed_stream(request)
    if resumed is not None:
        return resumed  # NOTE: the same request again (its X-Request-Id): the stream it started
    model = state.model_name(body.model)
    body.check_supported()
    prompt = chat_prompt(body, state.llm.input_processor)
    params = await state.sampling_params(body, [prompt])
    response_id, request_id = request_ids("chatcmpl", body)
    outputs = await state.generate(request_id, [prompt], params, body)
    header = {"id": response_id, "created": now(), "model": model}
    tokenizer = state.llm.tokenizer
    # NOTE: vLLM's extras about the prompt: on the whole answer, or on a stream's first chunk.
    prompt_fields: dict[str, Any] = {}
    if body.return_token_ids:
        prompt_fields["prompt_token_ids"] = prompt.token_ids
    if body.return_prompt_text:
        prompt_fields["prompt_text"] = prompt.text
    if body.stream:
        tools = [ChoiceAnswer(body, state.tool_call_parser, state.reasoning_parser) for _ in range(body.n)]
        chunks = chat_chunks(outputs, header, tokenizer, len(prompt.token_ids), prompt_fields, body, tools)
        return sse_response(request, chunks, response_id)
    (output,) = await unless_disconnected(request, collect(outputs, 1, body.n))
    return JSONResponse(chat_completion_body(
        header, output, tokenizer, body, state.tool_call_parser, state.reasoning_parser
    ) | prompt_fields)


async def chat_chunks(
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    header: dict[str, Any],
    tokenizer: Tokenizer,
    num_prompt_tokens: int,
    prompt_fields: dict[str, Any],
    body: ChatCompletionRequest,
    tools: list[ChoiceAnswer],
) -> AsyncIterator[dict[str, Any]]:
    """The chunks of a streamed chat answer (and of a streamed Responses answer, made from them)."""
    header = {**header, "object": "chat.completion.chunk"}
    num_tokens = num_cached_tokens = 0
    as_ids = bool(body.return_tokens_as_token_ids)

    def chunk(choice: dict[str, Any]) -> dict[str, Any]:
        if body.continuous_usage_stats:
            return {**header, "choices": [choice], "usage": usage(num_prompt_tokens, num_tokens, num_cached_tokens)}
        return {**header, "choices": [choice]}

    for opening in _openings(body):
        yield chunk(opening) | (prompt_fields if opening["index"] == 0 and "role" in opening["delta"] else {})
    async for index, output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        num_cached_tokens = max(num_cached_tokens, output.num_cached_tokens)
        if (
            completion.text or completion.finish_reason is not None or completion.logprobs is not None
            or output.prompt_logprobs is not None or (body.return_token_ids and completion.token_ids)
        ):
            deltas, finish_reason = _deltas(tools[index], completion.text, completion.finish_reason)
            # NOTE: a step's text may give several deltas (content, then a call); the step's
            # logprobs, token ids and finish ride on the last.
            for delta in deltas[:-1]:
                yield chunk(_choice(index, delta))
            logprobs = chat_logprobs(tokenizer, completion.logprobs, as_ids)
            choice = _choice(index, deltas[-1] if deltas else {}, logprobs, finish_reason, completion.stop_reason)
            if body.return_token_ids:
                choice["token_ids"] = completion.token_ids
            out = chunk(choice)
            if output.prompt_logprobs is not None and body.prompt_logprobs is not None:
                out["prompt_logprobs"] = prompt_logprobs_list(tokenizer, output.prompt_logprobs)
            yield out
    if body.include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, num_tokens, num_cached_tokens)}


def _openings(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Each choice's first chunk (the role), then the echoed text if any."""
    openings = []
    for index in range(body.n):
        openings.append(_choice(index, {"role": "assistant", "content": ""}))
        if body.echoed_text:
            openings.append(_choice(index, {"content": body.echoed_text}))
    return openings


def _deltas(tools: ChoiceAnswer, text: str, finish_reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
    """A step's deltas of one choice (content, tool-call pieces) and its finish reason."""
    deltas = tools.delta(text)
    if finish_reason is not None:
        last_deltas, finish_reason = tools.finish(finish_reason)
        deltas += last_deltas
    return deltas, finish_reason


def _choice(
    index: int,
    delta: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, **choice_end(finish_reason, stop_reason)}
