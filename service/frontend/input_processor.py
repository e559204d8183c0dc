"""Prompts (text, token ids or chat messages) → validated EngineCoreRequests."""

from __future__ import annotations

import time
from typing import Any

from proto.engine_input import EngineCoreRequest, SamplingParams
from service.model_files.tokenizer import Tokenizer


class PromptTooLongError(ValueError):
    """The prompt plus the tokens asked for do not fit the model's context."""


class InputProcessor:
    """Tokenizes and checks prompts against the engine's limits."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size

    def render_chat(
        self, messages: list[dict[str, Any]], continue_final_message: bool = False, **template_kwargs: Any
    ) -> str:
        """The chat's prompt text; `continue_final_message` cuts it right after the last message's
        content, so generation continues that message (as transformers does)."""
        prompt = self.tokenizer.apply_chat_template(messages, **template_kwargs)
        if continue_final_message:
            final = str(messages[-1]["content"]).strip()
            end = prompt.rfind(final)
            if not final or end == -1:
                raise ValueError("the final message's content is not in the rendered prompt")
            prompt = prompt[: end + len(final)]
        return prompt

    def tokenize(self, prompt: str) -> list[int]:
        return self.tokenizer.encode(prompt, add_special_tokens=True)

    def default_max_tokens(self, prompt_token_ids: list[int]) -> int:
        return max(1, self.max_model_len - len(prompt_token_ids))

    def process(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        priority: int = 0,
    ) -> EngineCoreRequest:
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        if any(not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise ValueError(f"prompt token ids must be in [0, {self.vocab_size})")
        num_prompt = len(prompt_token_ids)
        if num_prompt + sampling_params.max_tokens > self.max_model_len:
            raise PromptTooLongError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {num_prompt + sampling_params.max_tokens} tokens ({num_prompt} in the "
                f"messages, {sampling_params.max_tokens} in the completion). Please reduce the "
                "length of the messages or completion."
            )
        return EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=prompt_token_ids,
            sampling_params=sampling_params,
            arrival_time=time.time(),
            priority=priority,
        )
