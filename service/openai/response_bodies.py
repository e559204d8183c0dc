"""OpenAI response bodies from the engine's outputs, whole or chunk by chunk (the same fields either
way): a chat answer's and a completions answer's, with their ids, `created` and usage."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from proto.engine_output import Logprobs
from service.frontend.input_processor import Prompt
from service.frontend.outputs import RequestOutput
from service.model_files.tokenizer import Tokenizer
from service.openai.answer import Answer, choice_answer
from service.openai.deltas import AnswerStep, CallPiece, Content, Delta, Reasoning, Usage, reasoning_fields
from service.openai.logprobs_format import (
    chat_logprobs,
    completion_logprobs,
    echoed_completion_logprobs,
    join_completion_logprobs,
    prompt_logprobs_list,
)
from service.openai.prepare import Prepared
from service.openai.protocol import ChatCompletionRequest, CompletionRequest

Outputs = AsyncIterator[tuple[int, RequestOutput]]


class ChatResponse:
    """A chat request's answer: `chat.completion` whole, or its `chat.completion.chunk`s (a Responses
    answer is made from these too); reasoning, content and tool calls split by `choice_answer`'s reader."""

    def __init__(
        self, prepared: Prepared, body: ChatCompletionRequest, tokenizer: Tokenizer,
        tool_call_parser: str | None = None, reasoning_parser: str | None = None,
    ) -> None:
        self.body = body
        self.tokenizer = tokenizer
        self.created = now()
        self.header = {"id": prepared.response_id, "created": self.created, "model": prepared.model}
        self.num_prompt_tokens = prepared.num_prompt_tokens
        self.answers = [choice_answer(body, tool_call_parser, reasoning_parser) for _ in range(body.n)]
        (prompt,) = prepared.prompts
        # NOTE: vLLM's extras about the prompt: on the whole answer, or on a stream's first chunk.
        self.prompt_fields: dict[str, Any] = {}
        if body.return_token_ids:
            self.prompt_fields["prompt_token_ids"] = prompt.token_ids
        if body.return_prompt_text:
            self.prompt_fields["prompt_text"] = prompt.text

    def whole(self, output: RequestOutput) -> dict[str, Any]:
        """`chat.completion`: the prompt's n choices, whole."""
        body, tokenizer = self.body, self.tokenizer
        as_ids = bool(body.return_tokens_as_token_ids)
        choices: list[dict[str, Any]] = []
        num_tokens = sum(len(c.token_ids) for c in output.outputs)
        whole = {
            **self.header,
            "object": "chat.completion",
            "choices": choices,
            "usage": usage(len(output.prompt_token_ids), num_tokens, output.num_cached_tokens),
            "prompt_logprobs": None,
        }
        if body.prompt_logprobs is not None:
            whole["prompt_logprobs"] = prompt_logprobs_list(tokenizer, output.prompt_logprobs)
        for choice in output.outputs:
            message, finish_reason = self.answers[choice.index].whole(choice.text, choice.finish_reason)
            if message.get("content") is not None:
                message["content"] = body.echoed_text + message["content"]
            fields = {
                "index": choice.index,
                "message": {"role": "assistant", **message},
                "logprobs": chat_logprobs(tokenizer, choice.logprobs, as_ids),
                "finish_reason": finish_reason,
                "stop_reason": choice.stop_reason,
            }
            if body.return_token_ids:
                fields["token_ids"] = choice.token_ids
            choices.append(fields)
        return whole | self.prompt_fields

    def num_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def content_logprobs(self, step: AnswerStep) -> list[dict[str, Any]]:
        """A step's logprobs in the chat's `logprobs.content` shape ([] when not asked)."""
        logprobs = chat_logprobs(self.tokenizer, step.completion.logprobs, bool(self.body.return_tokens_as_token_ids))
        return (logprobs or {}).get("content") or []

    def steps(self, outputs: Outputs) -> AsyncIterator[AnswerStep]:
        """The answer's typed steps: what its chunks, Anthropic's events and the Responses' events render."""
        return answer_steps(outputs, self.answers, self.num_prompt_tokens)

    async def chunks(self, outputs: Outputs) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streamed answer: each choice's role (and echoed text), its deltas, usage last if asked."""
        body, tokenizer = self.body, self.tokenizer
        header = {**self.header, "object": "chat.completion.chunk"}
        as_ids = bool(body.return_tokens_as_token_ids)
        last = Usage(self.num_prompt_tokens, 0, 0)

        def chunk(choice: dict[str, Any] | None) -> dict[str, Any]:
            """A chunk of `choice` (with the usage so far if asked), or with None the usage chunk."""
            if choice is None or body.continuous_usage_stats:
                return {**header, "choices": [] if choice is None else [choice], "usage": usage_of(last)}
            return {**header, "choices": [choice]}

        for opening in self._openings():
            yield chunk(opening) | (self.prompt_fields if opening["index"] == 0 and "role" in opening["delta"] else {})
        async for step in self.steps(outputs):
            last = step.usage
            completion, output = step.completion, step.output
            if not (
                completion.text or completion.finish_reason is not None or completion.logprobs is not None
                or output.prompt_logprobs is not None or (body.return_token_ids and completion.token_ids)
            ):
                continue
            deltas = step.deltas
            # NOTE: a step's text may give several deltas (content, then a call); the step's
            # logprobs, token ids and finish ride on the last.
            for delta in deltas[:-1]:
                yield chunk(_chat_choice(step.index, chat_delta(delta)))
            choice = _chat_choice(
                step.index, chat_delta(deltas[-1]) if deltas else {}, None, step.finish_reason, completion.stop_reason
            )
            if body.return_token_ids:
                choice["token_ids"] = completion.token_ids
            out = chunk(choice)
            choice["logprobs"] = chat_logprobs(tokenizer, completion.logprobs, as_ids)
            if output.prompt_logprobs is not None and body.prompt_logprobs is not None:
                out["prompt_logprobs"] = prompt_logprobs_list(tokenizer, output.prompt_logprobs)
            yield out
        if body.include_usage:
            yield chunk(None)

    def _openings(self) -> list[dict[str, Any]]:
        """Each choice's first chunk (the role), then the echoed text if any."""
        openings = []
        for index in range(self.body.n):
            openings.append(_chat_choice(index, {"role": "assistant", "content": ""}))
            if self.body.echoed_text:
                openings.append(_chat_choice(index, {"content": self.body.echoed_text}))
        return openings


class CompletionResponse:
    """A completions request's answer: `text_completion` whole or chunk by chunk, each prompt's n
    choices (choice `i * n + j` is prompt i's sample j), echoed prompts and their logprobs first when asked."""

    def __init__(self, prepared: Prepared, body: CompletionRequest, tokenizer: Tokenizer) -> None:
        self.body = body
        self.tokenizer = tokenizer
        self.header = {"id": prepared.response_id, "created": now(), "model": prepared.model}
        self.prompts = prepared.prompts
        self.num_prompt_tokens = prepared.num_prompt_tokens
        self.echoes = [self._echo(p) for p in prepared.prompts] if body.echo else [""] * len(prepared.prompts)

    def _echo(self, prompt: Prompt) -> str:
        # NOTE: special tokens kept, so the echoed text is what logprobs' tokens and offsets list.
        return prompt.text if prompt.text is not None else self.tokenizer.decode(prompt.token_ids, skip_special_tokens=False)

    def whole(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        """`text_completion`: every prompt's n choices, whole."""
        n = self.body.n
        choices = []
        for prompt_index, output in enumerate(outputs):
            for choice in output.outputs:
                index = prompt_index * n + choice.index
                logprobs = self._logprobs(index, choice.logprobs, output.prompt_logprobs, is_first=True)
                fields = {
                    **_completion_choice(
                        index, self.echoes[prompt_index] + choice.text, logprobs, choice.finish_reason, choice.stop_reason,
                    ),
                    "prompt_logprobs": self._prompt_logprobs(output.prompt_logprobs),
                }
                if self.body.return_token_ids:
                    fields |= {"prompt_token_ids": output.prompt_token_ids, "token_ids": choice.token_ids}
                choices.append(fields)
        num_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        num_cached_tokens = sum(o.num_cached_tokens for o in outputs)
        return {
            **self.header, "object": "text_completion", "choices": choices,
            "usage": usage(self.num_prompt_tokens, num_tokens, num_cached_tokens),
        }

    async def chunks(self, outputs: Outputs) -> AsyncIterator[dict[str, Any]]:
        """The chunks of a streamed answer: a choice's first chunk carries its echo (and prompt
        logprobs, token ids); usage last if asked."""
        body, echoes = self.body, self.echoes
        header = {**self.header, "object": "text_completion"}
        num_tokens = 0
        text_offsets = [len(echoes[index // body.n]) for index in range(len(echoes) * body.n)]
        is_first = [True] * len(text_offsets)
        num_cached_tokens = [0] * len(echoes)

        def chunk(choice: dict[str, Any]) -> dict[str, Any]:
            if body.continuous_usage_stats:
                return {**header, "choices": [choice], "usage": usage(self.num_prompt_tokens, num_tokens, sum(num_cached_tokens))}
            return {**header, "choices": [choice]}

        async for index, output in outputs:
            completion = output.outputs[0]
            prompt_index = index // body.n
            num_tokens += len(completion.token_ids)
            num_cached_tokens[prompt_index] = max(num_cached_tokens[prompt_index], output.num_cached_tokens)
            if not (is_first[index] or completion.text or completion.finish_reason is not None or (
                body.return_token_ids and completion.token_ids
            )):
                continue
            echo = echoes[prompt_index] if is_first[index] else ""
            logprobs = self._logprobs(index, completion.logprobs, output.prompt_logprobs, is_first[index], text_offsets[index])
            text_offsets[index] += len(completion.text)
            choice = _completion_choice(index, echo + completion.text, logprobs, completion.finish_reason, completion.stop_reason)
            if is_first[index] and body.prompt_logprobs is not None:
                choice["prompt_logprobs"] = self._prompt_logprobs(output.prompt_logprobs)
            if body.return_token_ids:
                if is_first[index]:
                    choice["prompt_token_ids"] = self.prompts[prompt_index].token_ids
                choice["token_ids"] = completion.token_ids
            is_first[index] = False
            yield chunk(choice)
        if body.include_usage:
            yield {**header, "choices": [], "usage": usage(self.num_prompt_tokens, num_tokens, sum(num_cached_tokens))}

    def _logprobs(
        self, index: int, logprobs: Logprobs | None, prompt_logprobs: Logprobs | None, is_first: bool,
        text_offset: int | None = None,
    ) -> dict[str, Any] | None:
        """Choice `index`'s logprobs (those of the echoed prompt too when `is_first`)."""
        body = self.body
        if body.logprobs is None:
            return None
        prompt_index = index // body.n
        if text_offset is None:
            text_offset = len(self.echoes[prompt_index])
        as_ids = bool(body.return_tokens_as_token_ids)
        generated = completion_logprobs(self.tokenizer, logprobs or Logprobs(), text_offset, as_ids)
        if not (body.echo and is_first):
            return generated
        echoed = echoed_completion_logprobs(
            self.tokenizer, self.prompts[prompt_index].token_ids, prompt_logprobs, body.logprobs, as_ids
        )
        return join_completion_logprobs(echoed, generated)

    def _prompt_logprobs(self, prompt_logprobs: Logprobs | None) -> list[dict[str, Any] | None] | None:
        if self.body.prompt_logprobs is None:
            return None
        return prompt_logprobs_list(self.tokenizer, prompt_logprobs)


def _chat_choice(
    index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None, stop_reason: int | str | None = None,
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": logprobs, **choice_end(finish_reason, stop_reason)}


def _completion_choice(
    index: int, text: str, logprobs: dict[str, Any] | None = None,
    finish_reason: str | None = None, stop_reason: int | str | None = None,
) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, **choice_end(finish_reason, stop_reason)}


def choice_end(finish_reason: str | None, stop_reason: int | str | None) -> dict[str, Any]:
    return {"finish_reason": finish_reason, "stop_reason": stop_reason}


def now() -> int:
    return int(time.time())


def usage_of(counts: Usage) -> dict[str, Any]:
    """OpenAI's usage of an answer's counts (the prompt tokens found in the prefix cache too)."""
    return usage(counts.num_prompt_tokens, counts.num_completion_tokens, counts.num_cached_tokens)


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


async def answer_steps(
    outputs: AsyncIterator[tuple[int, RequestOutput]], answers: Sequence[Answer], num_prompt_tokens: int,
) -> AsyncIterator[AnswerStep]:
    """Each output's step: its text split by its choice's reader (held back text comes at the end)."""
    num_tokens = num_cached_tokens = 0
    async for index, output in outputs:
        completion = output.outputs[0]
        num_tokens += len(completion.token_ids)
        num_cached_tokens = max(num_cached_tokens, output.num_cached_tokens)
        answer = answers[index]
        deltas = answer.delta(completion.text)
        finish_reason = completion.finish_reason
        if finish_reason is not None:
            last, finish_reason = answer.finish(finish_reason)
            deltas += last
        yield AnswerStep(index, deltas, finish_reason, Usage(num_prompt_tokens, num_tokens, num_cached_tokens), output)


def chat_delta(delta: Delta) -> dict[str, Any]:
    """A delta as a chat chunk's `delta`."""
    if isinstance(delta, Content):
        return {"content": delta.text}
    if isinstance(delta, Reasoning):
        return reasoning_fields(delta.text)
    return {"tool_calls": [_chat_call(piece) for piece in delta.pieces]}


def _chat_call(piece: CallPiece) -> dict[str, Any]:
    if piece.call_id is None:
        return {"index": piece.index, "function": {"arguments": piece.arguments}}
    return {"index": piece.index, "id": piece.call_id, "type": "function",
            "function": {"name": piece.name, "arguments": piece.arguments}}
