"""POST /v1/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.errors import APIError, parse_body
from service.api.protocol import CompletionRequest
from service.api.server_state import ServerState, collect, new_request_id, now, usage
from service.api.sse import sse_response
from service.outputs import RequestOutput


async def create_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, CompletionRequest)
    model = state.model_name(body)
    if isinstance(body.prompt, str):
        prompt_token_ids = state.llm.input_processor.tokenize(body.prompt)
        if not prompt_token_ids:
            raise APIError("The prompt is empty.", param="prompt")
    else:
        prompt_token_ids = list(body.prompt)
    params = state.sampling_params(body, prompt_token_ids, body.max_tokens)
    request_id = new_request_id("cmpl")
    outputs = state.generate(request_id, prompt_token_ids, params, body.priority)
    header = {"id": request_id, "object": "text_completion", "created": now(), "model": model}
    if body.stream:
        return sse_response(_chunks(outputs, header, len(prompt_token_ids), body.include_usage))
    return JSONResponse(await _response(outputs, header, len(prompt_token_ids)))


def _choice(text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


async def _chunks(
    outputs: AsyncIterator[RequestOutput], header: dict[str, Any], num_prompt_tokens: int, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    num_tokens = 0
    async for output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        if completion.text or completion.finish_reason is not None:
            yield {**header, "choices": [_choice(completion.text, completion.finish_reason)]}
    if include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, num_tokens)}


async def _response(
    outputs: AsyncIterator[RequestOutput], header: dict[str, Any], num_prompt_tokens: int
) -> dict[str, Any]:
    whole = await collect(outputs)
    return {
        **header,
        "choices": [_choice(whole.text, whole.finish_reason)],
        "usage": usage(num_prompt_tokens, whole.num_tokens),
    }
