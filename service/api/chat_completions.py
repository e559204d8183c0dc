"""POST /v1/chat/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.errors import APIError, parse_body
from service.api.protocol import ChatCompletionRequest
from service.api.server_state import ServerState, collect, new_request_id, now, usage
from service.api.sse import sse_response
from service.outputs import RequestOutput


async def create_chat_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, ChatCompletionRequest)
    model = state.model_name(body)
    try:
        prompt = state.llm.input_processor.render_chat(
            [m.to_template_dict() for m in body.messages],
            add_generation_prompt=body.add_generation_prompt,
            **(body.chat_template_kwargs or {}),
        )
    except Exception as exc:  # noqa: BLE001 - template errors are the request's fault
        raise APIError(f"The messages could not be rendered by the chat template: {exc}", param="messages") from exc
    prompt_token_ids = state.llm.tokenizer.encode(prompt)
    params = state.sampling_params(body, prompt_token_ids, body.requested_max_tokens)
    request_id = new_request_id("chatcmpl")
    outputs = state.generate(request_id, prompt_token_ids, params, body.priority)
    header = {"id": request_id, "created": now(), "model": model}
    if body.stream:
        return sse_response(_chunks(outputs, header, len(prompt_token_ids), body.include_usage))
    return JSONResponse(await _response(outputs, header, len(prompt_token_ids)))


async def _chunks(
    outputs: AsyncIterator[RequestOutput], header: dict[str, Any], num_prompt_tokens: int, include_usage: bool
) -> AsyncIterator[dict[str, Any]]:
    header = {**header, "object": "chat.completion.chunk"}
    yield {**header, "choices": [_choice({"role": "assistant", "content": ""}, None)]}
    num_tokens = 0
    async for output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        if completion.text or completion.finish_reason is not None:
            delta = {"content": completion.text} if completion.text else {}
            yield {**header, "choices": [_choice(delta, completion.finish_reason)]}
    if include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, num_tokens)}


def _choice(delta: dict[str, Any], finish_reason: str | None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


async def _response(
    outputs: AsyncIterator[RequestOutput], header: dict[str, Any], num_prompt_tokens: int
) -> dict[str, Any]:
    whole = await collect(outputs)
    message = {"role": "assistant", "content": whole.text}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": whole.finish_reason}
    return {
        **header,
        "object": "chat.completion",
        "choices": [choice],
        "usage": usage(num_prompt_tokens, whole.num_tokens),
    }
