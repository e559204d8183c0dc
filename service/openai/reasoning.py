"""Reasoning kept apart from the answer: `<think>…</think>` split out into `reasoning_content`
(and `reasoning`, as vLLM now names it), whole or while streaming, the same either way.

qwen3: an answer that opens with `<think>` reasons until `</think>`; any other is all content.
deepseek_r1: its template opens `<think>` in the prompt, so an answer reasons from its start
(its own `<think>` optional) until `</think>`, or to its end.
"""

from __future__ import annotations

from dataclasses import replace

from proto.engine_input import StructuredOutput
from service.model_files.tokenizer import Tokenizer
from service.openai.harmony import FINAL_HEADER
from service.openai.tool_calls import partial_prefix

REASONING_PARSERS = ("qwen3", "deepseek_r1")
THINK_START, THINK_END = "<think>", "</think>"


def parse_reasoning(parser: str, text: str) -> tuple[str | None, str]:
    """(reasoning, content) of a whole answer; reasoning None when it had none."""
    stream = ReasoningStream(parser)
    reasoning, content = stream.feed(text)
    rest_reasoning, rest_content = stream.finish()
    reasoning += rest_reasoning
    return (reasoning if stream.has_reasoned else None), content + rest_content


def constraint_after_reasoning(
    spec: StructuredOutput, parser: str, tokenizer: Tokenizer, prompt_token_ids: list[int]
) -> StructuredOutput:
    """`spec` for a reasoning model's answer: it holds once the reasoning has ended (the engine
    watches for `</think>`), or from the first token when the prompt already ended it (thinking
    turned off by the template). The answer reasons from its start when the prompt opened
    `<think>` or the parser says it always does (deepseek_r1, harmony: until its final channel's
    header); else (qwen3) it may open it."""
    if parser == "harmony":
        return replace(spec, reasoning_end_ids=tokenizer.encode(FINAL_HEADER), is_reasoning=True)
    start_ids = tokenizer.encode(THINK_START)
    end_ids = tokenizer.encode(THINK_END)
    last_start, last_end = _last_index(prompt_token_ids, start_ids), _last_index(prompt_token_ids, end_ids)
    if last_end > last_start:
        return spec
    is_reasoning = last_start >= 0 or parser == "deepseek_r1"
    return replace(spec, reasoning_start_ids=start_ids, reasoning_end_ids=end_ids, is_reasoning=is_reasoning)


def _last_index(token_ids: list[int], pattern: list[int]) -> int:
    """Where `pattern` last starts in `token_ids`, or -1."""
    size = len(pattern)
    return next((i for i in range(len(token_ids) - size, -1, -1) if token_ids[i : i + size] == pattern), -1)


class ReasoningStream:
    """Splits a streamed answer into reasoning and content deltas; text that may be a tag is
    held back until it is known."""

    def __init__(self, parser: str) -> None:
        self._fallback = "reasoning" if parser == "deepseek_r1" else "content"
        self._state = "start"
        self._pending = ""
        self.has_reasoned = False

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning, content) that `delta` makes sure of."""
        self._pending += delta
        reasoning, content = [], []
        while self._pending:
            if self._state == "start":
                opening = self._pending.lstrip()
                if not opening or (THINK_START.startswith(opening) and opening != THINK_START):
                    break  # NOTE: whitespace, or the start of `<think>`: not known yet
                if opening.startswith(THINK_START):
                    self._state, self._pending = "reasoning", opening[len(THINK_START):]
                else:
                    self._state = self._fallback
                self.has_reasoned = self._state == "reasoning"
            elif self._state == "reasoning":
                end = self._pending.find(THINK_END)
                if end != -1:
                    reasoning.append(self._pending[:end])
                    self._state, self._pending = "content", self._pending[end + len(THINK_END):]
                    continue
                keep = partial_prefix(self._pending, THINK_END)
                reasoning.append(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep:]
                break
            else:
                content.append(self._pending)
                self._pending = ""
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is held back, as what it would have been."""
        rest, self._pending = self._pending, ""
        state = self._fallback if self._state == "start" else self._state
        if state == "reasoning":
            self.has_reasoned = True
            return rest, ""
        return "", rest
