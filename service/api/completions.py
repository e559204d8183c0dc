"""POST /v1/completions: one prompt or many (text or token ids), n choices each."""

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
from service.openai.protocol import CompletionRequest
from service.openai.request_fields import completion_prompts, now, request_ids, usage
from service.openai.responses import CompletionLogprobs, completion_body, completion_choice


async def create_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, CompletionRequest, state.max_request_body_bytes)
    resumed = resumed_stream(request)
    if resumed is not None:
        return resumed  # NOTE: the same request again (its X-Request-Id): the stream it started
    model = state.model_name(body.model)
    body.check_supported()
    prompts = completion_prompts(body, state.llm.input_processor)
    params = await state.sampling_params(body, prompts)
    response_id, request_id = request_ids("cmpl", body)
    outputs = await state.generate(request_id, prompts, params, body)
    header = {"id": response_id, "created": now(), "model": model}
    formatter = CompletionLogprobs(state.llm.tokenizer, body, prompts)
    num_prompt_tokens = sum(len(p.token_ids) for p in prompts)
    if body.stream:
        return sse_response(
            request, _chunks(outputs, {**header, "object": "text_completion"}, formatter, num_prompt_tokens), response_id
        )
    whole = await unless_disconnected(request, collect(outputs, len(prompts), body.n))
    return JSONResponse(completion_body(header, whole, formatter))


async def _chunks(
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    header: dict[str, Any],
    formatter: CompletionLogprobs,
    num_prompt_tokens: int,
) -> AsyncIterator[dict[str, Any]]:
    body, echoes = formatter.body, formatter.echoes
    num_tokens = 0
    text_offsets = [len(echoes[index // body.n]) for index in range(len(echoes) * body.n)]
    is_first = [True] * len(text_offsets)

    num_cached_tokens = [0] * len(echoes)

    def chunk(choice: dict[str, Any]) -> dict[str, Any]:
        if body.continuous_usage_stats:
            return {**header, "choices": [choice], "usage": usage(num_prompt_tokens, num_tokens, sum(num_cached_tokens))}
        return {**header, "choices": [choice]}

    async for index, output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        num_cached_tokens[index // body.n] = max(num_cached_tokens[index // body.n], output.num_cached_tokens)
        if is_first[index] or completion.text or completion.finish_reason is not None or (
            body.return_token_ids and completion.token_ids
        ):
            echo = echoes[index // body.n] if is_first[index] else ""
            logprobs = formatter.logprobs(
                index, completion.logprobs, output.prompt_logprobs, is_first[index], text_offsets[index]
            )
            text_offsets[index] += len(completion.text)
            choice = completion_choice(index, echo + completion.text, logprobs, completion.finish_reason, completion.stop_reason)
            if is_first[index] and body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = formatter.prompt_logprobs(output.prompt_logprobs)
            if body.return_token_ids:
                if is_first[index]:
                    choice["prompt_token_ids"] = formatter.prompts[index // body.n].token_ids
                choice["token_ids"] = completion.token_ids
            is_first[index] = False
            yield chunk(choice)
    if body.include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, num_tokens, sum(num_cached_tokens))}
