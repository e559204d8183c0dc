"""Prompts (text, token ids or chat messages) → validated EngineCoreRequests, one per sample."""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from proto.engine_input import EngineCoreRequest, SamplingParamsError
from service.frontend.sampling_params import SamplingParams
from service.model_files.tokenizer import Tokenizer


class PromptTooLongError(ValueError):
    """The prompt plus the tokens asked for do not fit the model's context."""

    def __init__(self, max_model_len: int, num_prompt: int, max_tokens: int) -> None:
        self.max_model_len, self.num_prompt, self.max_tokens = max_model_len, num_prompt, max_tokens
        super().__init__(self.describe("prompt"))

    def describe(self, prompt_name: str) -> str:
        """OpenAI's wording, naming the request's own field for its prompt (`messages`, `prompt`, `input`)."""
        return (
            f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
            f"{self.num_prompt + self.max_tokens} tokens ({self.num_prompt} in the {prompt_name}, "
            f"{self.max_tokens} in the completion). Please reduce the length of the {prompt_name} or completion."
        )


class TruncationError(ValueError):
    """truncate_prompt_tokens asks for more tokens than the context holds."""


class Prompt(NamedTuple):
    """A prompt's token ids, and its text where it came as text."""

    token_ids: list[int]
    text: str | None = None


class InputProcessor:
    """Renders and tokenizes prompts, checks them against the engine's limits, fans out `n`."""

    def __init__(
        self, tokenizer: Tokenizer, max_model_len: int, vocab_size: int, grammar_backend: str = "xgrammar"
    ) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.grammar_backend = grammar_backend  # the engine's: output constraints are checked with it

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        add_special_tokens: bool = False,
        truncate_prompt_tokens: int | None = None,
        truncation_side: str | None = None,
        **template_kwargs: Any,
    ) -> Prompt:
        """The chat rendered by the model's template, then tokenized (with BOS/EOS on top of the
        template's only if `add_special_tokens`) and `truncated`; `continue_final_message` cuts the
        text right after the last message's content, so generation continues that message (as
        transformers does)."""
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
        if continue_final_message:
            final = str(messages[-1]["content"]).strip()
            end = text.rfind(final)
            if not final or end == -1:
                raise ValueError("the final message's content is not in the rendered prompt")
            text = text[: end + len(final)]
        prompt = Prompt(self.tokenizer.encode(text, add_special_tokens=add_special_tokens), text)
        return self.truncated(prompt, truncate_prompt_tokens, truncation_side)

    def text_prompt(
        self, text: str | list[int], add_special_tokens: bool = True,
        truncate_prompt_tokens: int | None = None, truncation_side: str | None = None,
    ) -> Prompt:
        """A text prompt tokenized (token ids taken as they are), then `truncated`."""
        if isinstance(text, str):
            prompt = Prompt(self.tokenizer.encode(text, add_special_tokens=add_special_tokens), text)
        else:
            prompt = Prompt(text)
        return self.truncated(prompt, truncate_prompt_tokens, truncation_side)

    def truncated(self, prompt: Prompt, num_tokens: int | None, side: str | None = None) -> Prompt:
        """The prompt cut to its last `num_tokens` tokens (its first with `side` "right"; -1: the
        context's length), as vLLM's truncate_prompt_tokens; its text is then the kept tokens'."""
        if num_tokens is None:
            return prompt
        if num_tokens == -1:
            num_tokens = self.max_model_len
        if num_tokens > self.max_model_len:
            raise TruncationError(
                f"truncate_prompt_tokens ({num_tokens}) is larger than the context length ({self.max_model_len})"
            )
        if len(prompt.token_ids) <= num_tokens:
            return prompt
        token_ids = prompt.token_ids[:num_tokens] if side == "right" else prompt.token_ids[len(prompt.token_ids) - num_tokens:]
        return Prompt(token_ids)

    def default_max_tokens(self, prompt_token_ids: list[int]) -> int:
        return max(1, self.max_model_len - len(prompt_token_ids))

    def process(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        data_parallel_rank: int | None = None,
    ) -> list[EngineCoreRequest]:
        """The request's n samples as engine requests (ids `request_id`, or `request_id-i` when
        n > 1), all checked before any is returned; raises ValueError for a bad prompt."""
        self._check(prompt_token_ids, params)
        arrival_time = time.time()
        return [
            EngineCoreRequest(
                request_id=request_id if params.n == 1 else f"{request_id}-{index}",
                prompt_token_ids=prompt_token_ids,
                sampling_params=params.sample_params(index),
                arrival_time=arrival_time,
                priority=priority,
                data_parallel_rank=data_parallel_rank,
            )
            for index in range(params.n)
        ]

    def _check(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        for name, token_ids in (("logit_bias", [t for t, _ in params.logit_bias]), ("stop_token_ids", params.stop_token_ids)):
            if any(t >= self.vocab_size for t in token_ids):
                raise SamplingParamsError(name, token_ids, f"token ids below {self.vocab_size}")
        num_prompt = len(prompt_token_ids)
        if num_prompt + params.max_tokens > self.max_model_len:
            raise PromptTooLongError(self.max_model_len, num_prompt, params.max_tokens)
