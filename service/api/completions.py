"""POST /v1/completions: one prompt or many (text or token ids), n choices each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.choice_accumulator import collect
from service.api.errors import APIError, parse_body
from service.api.logprobs_format import completion_logprobs
from service.api.protocol import CompletionRequest
from service.api.server_state import ServerState, new_request_id, now, usage
from service.api.sse import sse_response
from service.outputs import RequestOutput
from service.tokenizer import Tokenizer


async def create_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, CompletionRequest, state.max_request_body_bytes)
    model = state.model_name(body.model)
    body.check_supported()
    prompts = body.prompts
    if not prompts:
        raise APIError("The prompt is empty.", param="prompt")
    prompt_ids = [state.llm.input_processor.tokenize(p) if isinstance(p, str) else p for p in prompts]
    if any(not ids for ids in prompt_ids):
        raise APIError("The prompt is empty.", param="prompt")
    params = state.sampling_params(body, max(prompt_ids, key=len), body.max_tokens)
    request_id = new_request_id("cmpl")
    outputs = state.generate(request_id, prompt_ids, params, body)
    header = {"id": request_id, "object": "text_completion", "created": now(), "model": model}
    tokenizer = state.llm.tokenizer
    echoes = [""] * len(prompts)
    if body.echo:
        echoes = [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
    num_prompt_tokens = sum(len(ids) for ids in prompt_ids)
    if body.stream:
        return sse_response(_chunks(outputs, header, tokenizer, num_prompt_tokens, echoes, body))
    choices = await collect(outputs, len(prompts) * body.n)
    return JSONResponse({
        **header,
        "choices": [
            _choice(index, echoes[index // body.n] + choice.text,
                    completion_logprobs(tokenizer, choice.logprobs), choice.finish_reason, choice.stop_reason)
            for index, choice in enumerate(choices)
        ],
        "usage": usage(num_prompt_tokens, sum(c.num_tokens for c in choices)),
    })


def _choice(
    index: int,
    text: str,
    logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
) -> dict[str, Any]:
    return {
        "index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


async def _chunks(
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    header: dict[str, Any],
    tokenizer: Tokenizer,
    num_prompt_tokens: int,
    echoes: list[str],
    body: CompletionRequest,
) -> AsyncIterator[dict[str, Any]]:
    num_tokens = 0
    text_offsets = [len(echoes[index // body.n]) for index in range(len(echoes) * body.n)]

    def chunk(choice: dict[str, Any]) -> dict[str, Any]:
        if body.continuous_usage_stats:
            return {**header, "choices": [choice], "usage": usage(num_prompt_tokens, num_tokens)}
        return {**header, "choices": [choice]}

    for index, offset in enumerate(text_offsets):
        if offset:
            yield chunk(_choice(index, echoes[index // body.n]))
    async for index, output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        if completion.text or completion.finish_reason is not None or completion.logprobs is not None:
            logprobs = completion_logprobs(tokenizer, completion.logprobs, text_offsets[index])
            text_offsets[index] += len(completion.text)
            yield chunk(_choice(index, completion.text, logprobs, completion.finish_reason, completion.stop_reason))
    if body.include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, num_tokens)}
