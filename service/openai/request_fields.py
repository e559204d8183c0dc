"""What a request body gives the engine (its prompts, its SamplingParams, its engine requests,
each checked against the model, a 400 naming the bad field) and the fields every response
carries (ids, `created`, usage). The routes and `zeroserve generate` both go through here."""

from __future__ import annotations

import time
import uuid
from typing import Any

from proto.engine_input import EngineCoreRequest, SamplingParamsError
from service.frontend.input_processor import InputProcessor, Prompt, PromptTooLongError
from service.frontend.sampling_params import SamplingParams
from service.openai.errors import APIError
from service.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest


def chat_prompt(body: ChatCompletionRequest, input_processor: InputProcessor) -> Prompt:
    """The body's messages rendered by the chat template (its tools too unless tool_choice is
    "none") and tokenized."""
    template_kwargs = template_kwargs_of(body)
    if body.tools and body.tool_choice != "none":
        template_kwargs.setdefault("tools", body.tools)
    try:
        prompt = input_processor.chat_prompt(
            [m.to_template_dict() for m in body.messages],
            add_generation_prompt=body.add_generation_prompt,
            continue_final_message=body.continue_final_message,
            add_special_tokens=body.add_special_tokens,
            **template_kwargs,
        )
    except Exception as exc:
        raise APIError(f"The messages could not be rendered by the chat template: {exc}", param="messages") from exc
    return _truncated(body, input_processor, prompt)


def template_kwargs_of(body: ChatCompletionRequest) -> dict[str, Any]:
    """What the chat template gets besides the messages: chat_template_kwargs, documents, and
    reasoning_effort (with enable_thinking unless given), as vLLM passes them."""
    kwargs = {**(body.chat_template_kwargs or {})}
    if body.documents is not None:
        kwargs.setdefault("documents", body.documents)
    if body.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
        kwargs.setdefault("enable_thinking", body.reasoning_effort != "none")
    return kwargs


def completion_prompts(body: CompletionRequest, input_processor: InputProcessor) -> list[Prompt]:
    """The body's prompts (text or token ids), tokenized; a 400 if any is empty."""
    prompts = [
        input_processor.text_prompt(p, body.add_special_tokens) if isinstance(p, str) else Prompt(p)
        for p in body.prompts
    ]
    if not prompts or any(not p.token_ids for p in prompts):
        raise APIError("The prompt is empty.", param="prompt")
    return [_truncated(body, input_processor, p) for p in prompts]


def _truncated(body: SamplingRequest, input_processor: InputProcessor, prompt: Prompt) -> Prompt:
    try:
        return input_processor.truncated(prompt, body.truncate_prompt_tokens, body.truncation_side)
    except ValueError as exc:
        raise APIError(str(exc), param="truncate_prompt_tokens") from exc


def build_sampling_params(
    body: SamplingRequest,
    input_processor: InputProcessor,
    prompts: list[Prompt],
    generation_defaults: dict[str, float],
    max_n: int,
) -> SamplingParams:
    """The body's SamplingParams (max_tokens by default what the longest prompt leaves of the
    context)."""
    if body.n > max_n:
        raise APIError(f"'n' must be at most {max_n}, got {body.n}.", param="n")
    max_tokens = body.requested_max_tokens
    if max_tokens is None:
        max_tokens = input_processor.default_max_tokens(max((p.token_ids for p in prompts), key=len))
    try:
        return body.to_sampling_params(max_tokens, generation_defaults, input_processor.grammar_backend)
    except SamplingParamsError as exc:
        raise _field_error(body, exc) from exc


def engine_requests(
    body: SamplingRequest,
    input_processor: InputProcessor,
    request_id: str,
    prompt: Prompt,
    params: SamplingParams,
) -> list[EngineCoreRequest]:
    """One prompt's n samples as engine requests, checked against the model."""
    try:
        return input_processor.process(
            request_id, prompt.token_ids, params, body.priority, body.data_parallel_rank
        )
    except SamplingParamsError as exc:
        raise _field_error(body, exc) from exc
    except PromptTooLongError as exc:
        # NOTE: a prompt that alone fills the context is the prompt's fault, as OpenAI says it.
        is_prompt_alone = len(prompt.token_ids) >= input_processor.max_model_len
        param = body.PROMPT_PARAM if is_prompt_alone else body.param_name("max_tokens")
        raise APIError(exc.describe(body.PROMPT_PARAM), param=param, code="context_length_exceeded") from exc
    except ValueError as exc:
        raise APIError(str(exc), param="prompt") from exc


def _field_error(body: SamplingRequest, error: SamplingParamsError) -> APIError:
    param = body.param_name(error.name)
    return APIError(f"'{param}' must be {error.allowed}, got {error.value}.", param=param)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def request_ids(prefix: str, body: SamplingRequest) -> tuple[str, str]:
    """The response's id (`prefix-<request_id>` when the body names one, as vLLM has it) and its
    engine requests' (unique even when two bodies give the same request_id)."""
    if body.request_id is None:
        request_id = new_request_id(prefix)
        return request_id, request_id
    response_id = f"{prefix}-{body.request_id}"
    return response_id, f"{response_id}-{uuid.uuid4().hex[:8]}"


def now() -> int:
    return int(time.time())


def usage(num_prompt_tokens: int, num_completion_tokens: int, num_cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's usage; with `num_cached_tokens`, the prompt tokens found in the prefix cache too."""
    fields: dict[str, Any] = {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }
    if num_cached_tokens is not None:
        fields["prompt_tokens_details"] = {"cached_tokens": num_cached_tokens}
    return fields
