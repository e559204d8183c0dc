"""One chat choice's generated text as OpenAI's message: reasoning (with a reasoning parser),
then content and tool calls, whole or delta by delta (the same either way)."""

from __future__ import annotations

from typing import Any

from service.openai.protocol import ChatCompletionRequest
from service.openai.reasoning import ReasoningStream, parse_reasoning
from service.openai.tool_calls import ChoiceTools, tool_mode


class ChoiceAnswer:
    """Splits a choice's text; tool calls are parsed from what follows the reasoning."""

    def __init__(self, body: ChatCompletionRequest, tool_call_parser: str | None, reasoning_parser: str | None) -> None:
        self.reasoning_parser = reasoning_parser
        self.include_reasoning = body.include_reasoning
        self._reasoning = None if reasoning_parser is None else ReasoningStream(reasoning_parser)
        self._tools = ChoiceTools(tool_mode(body.tools, body.tool_choice, tool_call_parser), body.tool_choice)

    def whole(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning, text = parse_reasoning(self.reasoning_parser, text)
        message, finish_reason = self._tools.whole(text, finish_reason)
        if reasoning is not None and self.include_reasoning:
            message |= _reasoning_fields(reasoning)
        return message, finish_reason

    def delta(self, text: str) -> list[dict[str, Any]]:
        if self._reasoning is None:
            return self._tools.delta(text)
        reasoning, content = self._reasoning.feed(text)
        return self._reasoning_deltas(reasoning) + self._tools.delta(content)

    def finish(self, finish_reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        deltas: list[dict[str, Any]] = []
        if self._reasoning is not None:
            reasoning, content = self._reasoning.finish()
            deltas += self._reasoning_deltas(reasoning) + self._tools.delta(content)
        last, finish_reason = self._tools.finish(finish_reason)
        return deltas + last, finish_reason


    def _reasoning_deltas(self, reasoning: str) -> list[dict[str, Any]]:
        return [_reasoning_fields(reasoning)] if reasoning and self.include_reasoning else []


def _reasoning_fields(reasoning: str) -> dict[str, str]:
    # NOTE: vLLM's name for it now, and the one clients of its earlier versions read.
    return {"reasoning": reasoning, "reasoning_content": reasoning}
