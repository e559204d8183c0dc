"""One chat choice's generated text as OpenAI's message: reasoning (with a reasoning parser),
then content and tool calls, whole or delta by delta (the same either way); a harmony answer
(gpt-oss) read by its own format."""

from __future__ import annotations

from typing import Any, Protocol

from service.openai.deltas import CallPiece, Content, Delta, Reasoning, ToolCalls, reasoning_fields
from service.openai.harmony import HarmonyStream, Piece, is_harmony_template
from service.openai.protocol import ChatCompletionRequest
from service.openai.reasoning import ReasoningStream, parse_reasoning
from service.openai.tool_calls import ChoiceTools, ToolCall, tool_mode

HARMONY = "harmony"


def resolve_parsers(
    tool_call_parser: str, reasoning_parser: str, chat_template: str | None
) -> tuple[str | None, str | None]:
    """The parsers a model's answers are read with (None: none): "auto" is harmony for a harmony
    template, else none; harmony is one format, so either parser's harmony makes both harmony."""
    auto = HARMONY if is_harmony_template(chat_template) else "none"
    parsers = [auto if name == "auto" else name for name in (tool_call_parser, reasoning_parser)]
    if HARMONY in parsers:
        return HARMONY, HARMONY
    tool, reasoning = (None if name == "none" else name for name in parsers)
    return tool, reasoning


class Answer(Protocol):
    """A choice's text as message fields (whole) or deltas (streamed)."""

    def whole(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]: ...

    def delta(self, text: str) -> list[Delta]: ...

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]: ...


def choice_answer(body: ChatCompletionRequest, tool_call_parser: str | None, reasoning_parser: str | None) -> Answer:
    """The reader of one choice's answer, as the parsers say."""
    if HARMONY in (tool_call_parser, reasoning_parser):
        return HarmonyAnswer(body)
    return ChoiceAnswer(body, tool_call_parser, reasoning_parser)


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
            message |= reasoning_fields(reasoning)
        return message, finish_reason

    def delta(self, text: str) -> list[Delta]:
        if self._reasoning is None:
            return self._tools.delta(text)
        reasoning, content = self._reasoning.feed(text)
        return self._reasoning_deltas(reasoning) + self._tools.delta(content)

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]:
        deltas: list[Delta] = []
        if self._reasoning is not None:
            reasoning, content = self._reasoning.finish()
            deltas += self._reasoning_deltas(reasoning) + self._tools.delta(content)
        last, finish_reason = self._tools.finish(finish_reason)
        return deltas + last, finish_reason


    def _reasoning_deltas(self, reasoning: str) -> list[Delta]:
        return [Reasoning(reasoning)] if reasoning and self.include_reasoning else []


class HarmonyAnswer:
    """A harmony answer: analysis as reasoning, final (and commentary without a recipient) as content,
    calls to `functions.NAME` as tool calls (when the request offered tools), each streamed as it
    comes (a call's name first, then its arguments). The whole answer is its deltas joined."""

    def __init__(self, body: ChatCompletionRequest) -> None:
        self.include_reasoning = body.include_reasoning
        self.is_calling = bool(body.tools) and body.tool_choice != "none"
        self._stream = HarmonyStream()
        self._calls: list[ToolCall] = []

    def whole(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        deltas = self.delta(text)
        last, finish_reason = self.finish(finish_reason)
        content = "".join(d.text for d in deltas + last if isinstance(d, Content))
        message: dict[str, Any] = {"content": content}
        if self._calls:
            message = {"content": content if content.strip() else None, "tool_calls": [c.to_dict() for c in self._calls]}
        if self._stream.has_reasoned and self.include_reasoning:
            message |= reasoning_fields("".join(d.text for d in deltas + last if isinstance(d, Reasoning)))
        return message, finish_reason

    def delta(self, text: str) -> list[Delta]:
        return self._deltas(self._stream.feed(text))

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]:
        deltas = self._deltas(self._stream.finish())
        # NOTE: a call ends generation (`<|call|>` is a stop token): as OpenAI, then "tool_calls".
        return deltas, "tool_calls" if self._calls and finish_reason == "stop" else finish_reason

    def _deltas(self, pieces: list[Piece]) -> list[Delta]:
        deltas: list[Delta] = []
        for kind, text in pieces:
            if kind == "reasoning" and self.include_reasoning:
                deltas.append(Reasoning(text))
            elif kind == "content":
                deltas.append(Content(text))
            elif kind == "call" and self.is_calling:
                self._calls.append(ToolCall(text, ""))
                deltas.append(ToolCalls((self._calls[-1].start(len(self._calls) - 1),)))
            elif kind == "arguments" and self.is_calling and self._calls:
                self._calls[-1].arguments += text
                deltas.append(ToolCalls((CallPiece(len(self._calls) - 1, text),)))
        return deltas
