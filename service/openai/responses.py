"""Whole OpenAI response bodies from whole outputs: what a non-streamed route returns and what
`zeroserve generate` writes for a line; streamed chunks share their choices' fields."""

from __future__ import annotations

from typing import Any

from proto.engine_output import Logprobs
from service.frontend.input_processor import Prompt
from service.frontend.outputs import RequestOutput
from service.model_files.tokenizer import Tokenizer
from service.openai.answer import ChoiceAnswer
from service.openai.logprobs_format import (
    chat_logprobs,
    completion_logprobs,
    echoed_completion_logprobs,
    join_completion_logprobs,
    prompt_logprobs_list,
)
from service.openai.protocol import ChatCompletionRequest, CompletionRequest
from service.openai.request_fields import usage


def choice_end(finish_reason: str | None, stop_reason: int | str | None) -> dict[str, Any]:
    return {"finish_reason": finish_reason, "stop_reason": stop_reason}


def chat_completion_body(
    header: dict[str, Any], output: RequestOutput, tokenizer: Tokenizer, body: ChatCompletionRequest,
    tool_call_parser: str | None = None, reasoning_parser: str | None = None,
) -> dict[str, Any]:
    """`chat.completion`: the prompt's n choices, whole."""
    prompt_logprobs = None
    if body.prompt_logprobs is not None:
        prompt_logprobs = prompt_logprobs_list(tokenizer, output.prompt_logprobs)
    as_ids = bool(body.return_tokens_as_token_ids)
    choices = []
    for choice in output.outputs:
        answer = ChoiceAnswer(body, tool_call_parser, reasoning_parser)
        message, finish_reason = answer.whole(choice.text, choice.finish_reason)
        if message.get("content") is not None:
            message["content"] = body.echoed_text + message["content"]
        fields = {
            "index": choice.index,
            "message": {"role": "assistant", **message},
            "logprobs": chat_logprobs(tokenizer, choice.logprobs, as_ids),
            **choice_end(finish_reason, choice.stop_reason),
        }
        if body.return_token_ids:
            fields["token_ids"] = choice.token_ids
        choices.append(fields)
    whole = {
        **header,
        "object": "chat.completion",
        "choices": choices,
        "usage": usage(
            len(output.prompt_token_ids), sum(len(c.token_ids) for c in output.outputs), output.num_cached_tokens
        ),
        "prompt_logprobs": prompt_logprobs,
    }
    if body.return_token_ids:
        whole["prompt_token_ids"] = output.prompt_token_ids
    return whole


class CompletionLogprobs:
    """A completions request's logprobs in its shape, echoed prompt tokens first when asked."""

    def __init__(self, tokenizer: Tokenizer, body: CompletionRequest, prompts: list[Prompt]) -> None:
        self.tokenizer = tokenizer
        self.body = body
        self.prompts = prompts
        self.echoes = [self._echo(p) for p in prompts] if body.echo else [""] * len(prompts)

    def _echo(self, prompt: Prompt) -> str:
        # NOTE: special tokens kept, so the echoed text is what logprobs' tokens and offsets list.
        return prompt.text if prompt.text is not None else self.tokenizer.decode(prompt.token_ids, skip_special_tokens=False)

    def logprobs(
        self, index: int, logprobs: Logprobs | None, prompt_logprobs: Logprobs | None, is_first: bool,
        text_offset: int | None = None,
    ) -> dict[str, Any] | None:
        """Choice `index`'s logprobs (those of the echoed prompt too when `is_first`)."""
        if self.body.logprobs is None:
            return None
        prompt_index = index // self.body.n
        if text_offset is None:
            text_offset = len(self.echoes[prompt_index])
        as_ids = bool(self.body.return_tokens_as_token_ids)
        generated = completion_logprobs(self.tokenizer, logprobs or Logprobs(), text_offset, as_ids)
        if not (self.body.echo and is_first):
            return generated
        echoed = echoed_completion_logprobs(
            self.tokenizer, self.prompts[prompt_index].token_ids, prompt_logprobs, self.body.logprobs, as_ids
        )
        return join_completion_logprobs(echoed, generated)

    def prompt_logprobs(self, prompt_logprobs: Logprobs | None) -> list[dict[str, Any] | None] | None:
        if self.body.prompt_logprobs is None:
            return None
        return prompt_logprobs_list(self.tokenizer, prompt_logprobs)


def completion_choice(
    index: int, text: str, logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None, stop_reason: int | str | None = None,
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, **choice_end(finish_reason, stop_reason)}


def completion_body(
    header: dict[str, Any], outputs: list[RequestOutput], formatter: CompletionLogprobs
) -> dict[str, Any]:
    """`text_completion`: each prompt's n choices, whole; choice `i * n + j` is prompt i's sample j."""
    n = formatter.body.n
    choices = []
    for prompt_index, output in enumerate(outputs):
        for choice in output.outputs:
            index = prompt_index * n + choice.index
            logprobs = formatter.logprobs(index, choice.logprobs, output.prompt_logprobs, is_first=True)
            fields = {
                **completion_choice(
                    index, formatter.echoes[prompt_index] + choice.text, logprobs,
                    choice.finish_reason, choice.stop_reason,
                ),
                "prompt_logprobs": formatter.prompt_logprobs(output.prompt_logprobs),
            }
            if formatter.body.return_token_ids:
                fields |= {"prompt_token_ids": output.prompt_token_ids, "token_ids": choice.token_ids}
            choices.append(fields)
    num_prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    num_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    num_cached_tokens = sum(o.num_cached_tokens for o in outputs)
    return {
        **header, "object": "text_completion", "choices": choices,
        "usage": usage(num_prompt_tokens, num_tokens, num_cached_tokens),
    }
