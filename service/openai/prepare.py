"""A request body checked once, against the served model and the server's limits, and turned into
the one value its route reads (`Prepared`): the served name, the prompts, the SamplingParams, the
engine requests and the ids. Chat, completions, Responses and `zeroserve generate` all prepare here;
every problem is a 400 naming the body's own field."""

from __future__ import annotations

import asyncio
import importlib
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proto.engine_input import EngineCoreRequest, SamplingParamsError
from service.frontend.input_processor import InputProcessor, Prompt, PromptTooLongError, TruncationError
from service.frontend.sampling_params import SamplingParams
from service.frontend.structured_output import library_of
from service.openai.errors import APIError
from service.openai.harmony import STOP_TOKENS, template_messages, template_tools
from service.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingRequest
from service.openai.reasoning import constraint_after_reasoning


@dataclass(frozen=True)
class Prepared:
    """A checked request: what the engine is sent (every sample of every prompt) and the ids its
    answer carries; choice `i * n + j` is sample j of prompt i."""

    model: str
    prompts: list[Prompt]
    params: SamplingParams
    parent_ids: list[str]  # each prompt's: its samples' outputs come back under it
    requests_by_prompt: list[list[EngineCoreRequest]]
    response_id: str
    constraint_param: str

    @property
    def engine_requests(self) -> list[EngineCoreRequest]:
        return [request for requests in self.requests_by_prompt for request in requests]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p.token_ids) for p in self.prompts)


class Preparer:
    """Turns request bodies into `Prepared` values for one served model."""

    def __init__(
        self,
        input_processor: InputProcessor,
        served_model_names: Sequence[str],
        generation_defaults: Mapping[str, float] | None = None,
        max_n: int = 16,
        reasoning_parser: str | None = None,
        is_any_model_served: bool = False,
        is_serving_rank: Callable[[int], bool] | None = None,
        is_generating: bool = True,
    ) -> None:
        self.input_processor = input_processor
        self.is_generating = is_generating  # NOTE: False for an encoder: it embeds and scores, never generates
        self.served_model_names = list(served_model_names)
        self.generation_defaults = dict(generation_defaults or {})
        self.max_n = max_n
        self.reasoning_parser = reasoning_parser
        # NOTE: `zeroserve generate` answers a line naming any model (a batch file names the one it was written for).
        self.is_any_model_served = is_any_model_served
        # NOTE: whether data_parallel_rank names an engine serving now (None: every rank is taken).
        self.is_serving_rank = is_serving_rank
        self.grammar_library = library_of(input_processor.grammar_backend)

    def model_name(self, model: str | None) -> str:
        """The served name the request asks for (the first one when it names none)."""
        if model is None or model == "" or self.is_any_model_served:
            return self.served_model_names[0]
        if model not in self.served_model_names:
            raise APIError(
                f"The model '{model}' does not exist. Served: {', '.join(self.served_model_names)}.",
                status_code=404,
                param="model",
                code="model_not_found",
            )
        return model

    async def prepare(
        self, body: ChatCompletionRequest | CompletionRequest, ids: tuple[str, str] | None = None
    ) -> Prepared:
        """`prepare_now`, once the grammar library is imported where the body may need it: in a thread,
        since xgrammar's import (torch's and transformers' among it) takes 1.5 s of CPU, which a
        gateway pays at its first request that may be constrained, never on its event loop."""
        library = self.grammar_library
        if body.names_a_constraint and library is not None and library not in sys.modules:
            await asyncio.to_thread(importlib.import_module, library)
        try:
            return self.prepare_now(body, ids)
        except APIError as error:
            raise body.named_error(error) from error.__cause__

    def prepare_now(
        self, body: ChatCompletionRequest | CompletionRequest, ids: tuple[str, str] | None = None
    ) -> Prepared:
        """In order: the model's name, the ids, the engine data_parallel_rank names, the fields this
        server honours, the prompts (rendered, tokenized, truncated), the SamplingParams, then each
        sample's engine request, checked against the model. `ids` is (response id, engine request id), by default from the
        body's request_id."""
        model = self.model_name(body.model)
        if not self.is_generating:
            raise APIError(f"The model '{model}' embeds texts; it does not generate. Use /v1/embeddings.",
                           param="model", code="model_not_supported")
        is_chat = isinstance(body, ChatCompletionRequest)
        response_id, request_id = ids or request_ids("chatcmpl" if is_chat else "cmpl", body)
        rank = body.data_parallel_rank
        if rank is not None and self.is_serving_rank is not None and not self.is_serving_rank(rank):
            raise APIError(f"'data_parallel_rank' {rank} is not a serving engine.", param="data_parallel_rank")
        body.check_supported()
        constraint_param = body.param_name(body.constraint_param)
        if self.is_harmony and isinstance(body, ChatCompletionRequest) and body.is_call_forced:
            raise APIError("This model's harmony format takes 'tool_choice' 'auto' or 'none': its calls are not forced.",
                           param="tool_choice")
        prompts = self._prompts(body)
        params = self._sampling_params(body, prompts)
        parent_ids = [request_id] if len(prompts) == 1 else [f"{request_id}-p{i}" for i in range(len(prompts))]
        processor = self.input_processor
        requests_by_prompt = []
        for parent_id, prompt in zip(parent_ids, prompts, strict=True):
            try:
                requests_by_prompt.append(
                    processor.process(parent_id, prompt.token_ids, params, body.priority, body.data_parallel_rank)
                )
            except SamplingParamsError as exc:
                raise _field_error(body, exc) from exc
            except PromptTooLongError as exc:
                # NOTE: a prompt that alone fills the context is the prompt's fault, as OpenAI says it.
                is_prompt_alone = len(prompt.token_ids) >= processor.max_model_len
                param = body.PROMPT_PARAM if is_prompt_alone else body.param_name("max_tokens")
                raise APIError(exc.describe(body.PROMPT_PARAM), param=param, code="context_length_exceeded") from exc
            except ValueError as exc:
                raise APIError(str(exc), param="prompt") from exc
        return Prepared(
            model, prompts, params, parent_ids, requests_by_prompt, response_id, constraint_param
        )

    def _prompts(self, body: ChatCompletionRequest | CompletionRequest) -> list[Prompt]:
        """A chat's messages rendered by the chat template (its tools too unless tool_choice is
        "none"), or a completion's prompts (text or token ids; none empty); tokenized and truncated."""
        processor, truncation = self.input_processor, (body.truncate_prompt_tokens, body.truncation_side)
        try:
            if isinstance(body, CompletionRequest):
                prompts = [processor.text_prompt(p, body.add_special_tokens, *truncation) for p in body.prompts]
                if not prompts or any(not p.token_ids for p in prompts):
                    raise APIError("The prompt is empty.", param="prompt")
                return prompts
            template_kwargs = _template_kwargs(body)
            messages = [m.to_template_dict() for m in body.messages]
            if self.is_harmony:
                messages = template_messages(messages)
                if "tools" in template_kwargs:
                    template_kwargs["tools"] = template_tools(template_kwargs["tools"])
            return [processor.chat_prompt(
                messages,
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                add_special_tokens=body.add_special_tokens,
                truncate_prompt_tokens=truncation[0],
                truncation_side=truncation[1],
                **template_kwargs,
            )]
        except TruncationError as exc:
            raise APIError(str(exc), param="truncate_prompt_tokens") from exc
        except APIError:
            raise
        except Exception as exc:
            raise APIError(f"The messages could not be rendered by the chat template: {exc}", param="messages") from exc

    def _sampling_params(self, body: SamplingRequest, prompts: list[Prompt]) -> SamplingParams:
        """The body's SamplingParams (max_tokens by default what the longest prompt leaves of the
        context); a chat answer's constraint holds after its reasoning, with a reasoning parser."""
        if body.n > self.max_n:
            raise APIError(f"'n' must be at most {self.max_n}, got {body.n}.", param="n")
        processor = self.input_processor
        max_tokens = body.requested_max_tokens
        if max_tokens is None:
            max_tokens = processor.default_max_tokens(max((p.token_ids for p in prompts), key=len))
        try:
            params = body.to_sampling_params(max_tokens, self.generation_defaults, processor.grammar_backend)
        except SamplingParamsError as exc:
            raise _field_error(body, exc) from exc
        spec = params.structured_output
        if spec is not None and self.reasoning_parser is not None and isinstance(body, ChatCompletionRequest):
            params.structured_output = constraint_after_reasoning(
                spec, self.reasoning_parser, processor.tokenizer, prompts[0].token_ids
            )
        if self.is_harmony and isinstance(body, ChatCompletionRequest):
            # NOTE: the answer is read by its special tokens, and ends on a call or a return.
            params.skip_special_tokens = False
            params.stop_token_ids += [t for t in self._harmony_stop_ids if t not in params.stop_token_ids]
        return params

    @property
    def is_harmony(self) -> bool:
        """Whether chats are answered in gpt-oss's harmony format."""
        return self.reasoning_parser == "harmony"

    @property
    def _harmony_stop_ids(self) -> list[int]:
        backend = self.input_processor.tokenizer.backend
        return [i for token in STOP_TOKENS if (i := backend.token_to_id(token)) is not None]


def _template_kwargs(body: ChatCompletionRequest) -> dict[str, Any]:
    """What the chat template gets besides the messages: chat_template_kwargs, the tools (unless
    tool_choice is "none"), documents, and reasoning_effort (with enable_thinking unless given), as
    vLLM passes them."""
    kwargs = {**(body.chat_template_kwargs or {})}
    if body.tools and body.tool_choice != "none":
        kwargs.setdefault("tools", body.tools)
    if body.documents is not None:
        kwargs.setdefault("documents", body.documents)
    if body.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", body.reasoning_effort)
        kwargs.setdefault("enable_thinking", body.reasoning_effort != "none")
    return kwargs


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
