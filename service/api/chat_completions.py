"""POST /v1/chat/completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.choice_accumulator import collect
from service.api.errors import parse_body
from service.api.server_state import ServerState
from service.api.sse import sse_response
from service.frontend.outputs import RequestOutput
from service.model_files.tokenizer import Tokenizer
from service.openai.errors import APIError
from service.openai.logprobs_format import chat_logprobs, prompt_logprobs_list
from service.openai.protocol import ChatCompletionRequest
from service.openai.request_fields import new_request_id, now, usage


async def create_chat_completion(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, ChatCompletionRequest, state.max_request_body_bytes)
    model = state.model_name(body.model)
    body.check_supported()
    template_kwargs = {**(body.chat_template_kwargs or {})}
    if body.tools and body.tool_choice != "none":
        template_kwargs.setdefault("tools", body.tools)
    try:
        prompt = state.llm.input_processor.render_chat(
            [m.to_template_dict() for m in body.messages],
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            **template_kwargs,
        )
    except Exception as exc:
        raise APIError(f"The messages could not be rendered by the chat template: {exc}", param="messages") from exc
    prompt_token_ids = state.llm.tokenizer.encode(prompt)
    params = state.sampling_params(body, prompt_token_ids, body.requested_max_tokens)
    request_id = new_request_id("chatcmpl")
    outputs = state.generate(request_id, [prompt_token_ids], params, body)
    header = {"id": request_id, "created": now(), "model": model}
    tokenizer = state.llm.tokenizer
    if body.stream:
        return sse_response(_chunks(outputs, header, tokenizer, len(prompt_token_ids), body))
    return JSONResponse(await _response(outputs, header, tokenizer, len(prompt_token_ids), body))


async def _chunks(
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    header: dict[str, Any],
    tokenizer: Tokenizer,
    num_prompt_tokens: int,
    body: ChatCompletionRequest,
) -> AsyncIterator[dict[str, Any]]:
    header = {**header, "object": "chat.completion.chunk"}
    num_tokens = 0

    def chunk(choice: dict[str, Any]) -> dict[str, Any]:
        if body.continuous_usage_stats:
            return {**header, "choices": [choice], "usage": usage(num_prompt_tokens, num_tokens)}
        return {**header, "choices": [choice]}

    for index in range(body.n):
        yield chunk(_choice(index, {"role": "assistant", "content": ""}))
    async for index, output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        if (
            completion.text or completion.finish_reason is not None or completion.logprobs is not None
            or output.prompt_logprobs is not None
        ):
            delta = {"content": completion.text} if completion.text else {}
            logprobs = chat_logprobs(tokenizer, completion.logprobs)
            out = chunk(_choice(index, delta, logprobs, completion.finish_reason, completion.stop_reason))
            if output.prompt_logprobs is not None and body.prompt_logprobs is not None:
                out["prompt_logprobs"] = prompt_logprobs_list(tokenizer, output.prompt_logprobs)
            yield out
    if body.include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, num_tokens)}


def _choice(
    index: int,
    delta: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
) -> dict[str, Any]:
    return {
        "index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }


async def _response(
    outputs: AsyncIterator[tuple[int, RequestOutput]],
    header: dict[str, Any],
    tokenizer: Tokenizer,
    num_prompt_tokens: int,
    body: ChatCompletionRequest,
) -> dict[str, Any]:
    choices = await collect(outputs, body.n)
    prompt_logprobs = None
    if body.prompt_logprobs is not None:
        prompt_logprobs = prompt_logprobs_list(tokenizer, choices[0].prompt_logprobs)
    return {
        **header,
        "object": "chat.completion",
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", "content": choice.text},
                "logprobs": chat_logprobs(tokenizer, choice.logprobs),
                "finish_reason": choice.finish_reason,
                "stop_reason": choice.stop_reason,
            }
            for index, choice in enumerate(choices)
        ],
        "usage": usage(num_prompt_tokens, sum(c.num_tokens for c in choices)),
        "prompt_logprobs": prompt_logprobs,
    }
