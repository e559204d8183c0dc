"""POST /v1/completions: one prompt or many (text or token ids), n choices each."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proto.engine_output import Logprobs
from service.api.choice_accumulator import collect
from service.api.errors import parse_body
from service.api.server_state import ServerState
from service.api.sse import sse_response
from service.frontend.outputs import RequestOutput
from service.model_files.tokenizer import Tokenizer
from service.openai.errors import APIError
from service.openai.logprobs_format import (
    completion_logprobs,
    echoed_completion_logprobs,
    join_completion_logprobs,
    prompt_logprobs_list,
)
from service.openai.protocol import CompletionRequest
from service.openai.request_fields import new_request_id, now, usage


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
    formatter = _LogprobsFormatter(tokenizer, body, prompt_ids, echoes)
    if body.stream:
        return sse_response(_chunks(outputs, header, formatter, num_prompt_tokens, echoes, body))
    choices = await collect(outputs, len(prompts) * body.n)
    return JSONResponse({
        **header,
        "choices": [
            {
                **_choice(index, echoes[index // body.n] + choice.text,
                          formatter.logprobs(index, choice.logprobs, choice.prompt_logprobs, is_first=True),
                          choice.finish_reason, choice.stop_reason),
                "prompt_logprobs": formatter.prompt_logprobs(choice.prompt_logprobs),
            }
            for index, choice in enumerate(choices)
        ],
        "usage": usage(num_prompt_tokens, sum(c.num_tokens for c in choices)),
    })


class _LogprobsFormatter:
    """A request's logprobs in completions' shape, echoed prompt tokens first when asked."""

    def __init__(
        self, tokenizer: Tokenizer, body: CompletionRequest, prompt_ids: list[list[int]], echoes: list[str]
    ) -> None:
        self.tokenizer = tokenizer
        self.body = body
        self.prompt_ids = prompt_ids
        self.echoes = echoes

    def logprobs(
        self, index: int, logprobs: Logprobs | None, prompt_logprobs: Logprobs | None, is_first: bool,
        text_offset: int | None = None,
    ) -> dict[str, Any] | None:
        if self.body.logprobs is None:
            return None
        prompt_index = index // self.body.n
        if text_offset is None:
            text_offset = len(self.echoes[prompt_index])
        generated = completion_logprobs(self.tokenizer, logprobs or Logprobs(), text_offset)
        if not (self.body.echo and is_first):
            return generated
        echoed = echoed_completion_logprobs(
            self.tokenizer, self.prompt_ids[prompt_index], prompt_logprobs, self.body.logprobs
        )
        return join_completion_logprobs(echoed, generated)

    def prompt_logprobs(self, prompt_logprobs: Logprobs | None) -> list[dict[str, Any] | None] | None:
        if self.body.prompt_logprobs is None:
            return None
        return prompt_logprobs_list(self.tokenizer, prompt_logprobs)


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
    formatter: _LogprobsFormatter,
    num_prompt_tokens: int,
    echoes: list[str],
    body: CompletionRequest,
) -> AsyncIterator[dict[str, Any]]:
    num_tokens = 0
    text_offsets = [len(echoes[index // body.n]) for index in range(len(echoes) * body.n)]
    is_first = [True] * len(text_offsets)

    def chunk(choice: dict[str, Any]) -> dict[str, Any]:
        if body.continuous_usage_stats:
            return {**header, "choices": [choice], "usage": usage(num_prompt_tokens, num_tokens)}
        return {**header, "choices": [choice]}

    async for index, output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        if is_first[index] or completion.text or completion.finish_reason is not None:
            echo = echoes[index // body.n] if is_first[index] else ""
            logprobs = formatter.logprobs(
                index, completion.logprobs, output.prompt_logprobs, is_first[index], text_offsets[index]
            )
            text_offsets[index] += len(completion.text)
            choice = _choice(index, echo + completion.text, logprobs, completion.finish_reason, completion.stop_reason)
            if is_first[index] and body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = formatter.prompt_logprobs(output.prompt_logprobs)
            is_first[index] = False
            yield chunk(choice)
    if body.include_usage:
        yield {**header, "choices": [], "usage": usage(num_prompt_tokens, num_tokens)}
