"""Tool calls: forced ones (`tool_choice` "required" or a named function) generated under a JSON
schema, and the model's own (`auto`) parsed from its Hermes `<tool_call>` format (Qwen2/Qwen3,
Hermes and others), whole or while streaming."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from service.openai.deltas import CallPiece, Content, Delta, ToolCalls

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
TOOL_CALL_PARSERS = ("hermes",)


@dataclass
class ToolCall:
    """One call: its id, the function's name and its arguments as JSON text."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def start(self, index: int) -> CallPiece:
        """The call whole, as the first piece of the choice's call `index`."""
        return CallPiece(index, self.arguments, self.id, self.name)


def function_of(tools: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    return next((t["function"] for t in tools if t.get("function", {}).get("name") == name), None)


def forced_schema(tools: list[dict[str, Any]], tool_choice: str | dict[str, Any], is_parallel: bool) -> dict[str, Any]:
    """The JSON schema a forced call is generated under: a named function's parameters, or for
    "required" a list of {name, parameters} objects, one of each tool's (at most one if not parallel)."""
    if isinstance(tool_choice, dict):
        function = function_of(tools, tool_choice["function"]["name"]) or {}
        return dict(function.get("parameters") or {"type": "object"})
    items = [
        {
            "type": "object",
            "properties": {"name": {"const": t["function"]["name"]},
                           "parameters": t["function"].get("parameters") or {"type": "object"}},
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not is_parallel:
        schema["maxItems"] = 1
    return schema


def forced_calls(text: str, tool_choice: str | dict[str, Any]) -> list[ToolCall]:
    """The calls of a forced answer (its text matched the forced schema, unless cut by max_tokens)."""
    if isinstance(tool_choice, dict):
        return [ToolCall(tool_choice["function"]["name"], text)]
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return []
    return [ToolCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]


def parse_hermes(text: str) -> tuple[str, list[ToolCall]]:
    """The content and the calls of a whole answer; a tag that holds no valid call stays content."""
    content, calls, rest = [], [], text
    while True:
        start = rest.find(HERMES_START)
        end = rest.find(HERMES_END, start + len(HERMES_START)) if start != -1 else -1
        if start == -1 or end == -1:
            content.append(rest)
            break
        call = _hermes_call(rest[start + len(HERMES_START):end])
        if call is None:
            content.append(rest[: end + len(HERMES_END)])
        else:
            content.append(rest[:start])
            calls.append(call)
        rest = rest[end + len(HERMES_END):]
    return "".join(content), calls


def _hermes_call(body: str) -> ToolCall | None:
    try:
        call = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    return ToolCall(call["name"], arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False))


class HermesStream:
    """Splits a streamed answer into content deltas and whole calls: text that may start a tag is
    held back until it is known not to, and a tag's text until it closes."""

    def __init__(self) -> None:
        self._pending = ""
        self.calls: list[ToolCall] = []

    def feed(self, delta: str) -> tuple[str, list[ToolCall]]:
        """The content that is sure not to be part of a call, and the calls completed by `delta`."""
        self._pending += delta
        content, calls = [], []
        while self._pending:
            start = self._pending.find(HERMES_START)
            if start == -1:
                keep = partial_prefix(self._pending, HERMES_START)
                content.append(self._pending[: len(self._pending) - keep])
                self._pending = self._pending[len(self._pending) - keep:]
                break
            end = self._pending.find(HERMES_END, start + len(HERMES_START))
            if end == -1:
                content.append(self._pending[:start])
                self._pending = self._pending[start:]
                break
            call = _hermes_call(self._pending[start + len(HERMES_START):end])
            if call is None:
                content.append(self._pending[: end + len(HERMES_END)])
            else:
                content.append(self._pending[:start])
                calls.append(call)
            self._pending = self._pending[end + len(HERMES_END):]
        self.calls += calls
        return "".join(content), calls

    def finish(self) -> str:
        """What is still held back (an unclosed tag, a partial one), as content."""
        rest, self._pending = self._pending, ""
        return rest


def partial_prefix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


def tool_mode(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None, parser: str | None) -> str | None:
    """How an answer's calls come: "named" or "required" (forced), "hermes" (parsed), or None."""
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        return "named"
    if tool_choice == "required":
        return "required"
    return parser


class ChoiceTools:
    """One choice's answer turned into content and tool calls, whole or delta by delta."""

    def __init__(self, mode: str | None, tool_choice: str | dict[str, Any] | None) -> None:
        self.mode = mode
        self.tool_choice = tool_choice
        self._text = ""
        self._stream = HermesStream()
        self._num_calls = 0

    def whole(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        """The message's fields and the finish reason ("tool_calls" once a call was made)."""
        if self.mode is None:
            return {"content": text}, finish_reason
        if self.mode == "hermes":
            content, calls = parse_hermes(text)
        else:
            content, calls = "", forced_calls(text, self.tool_choice or "required")
        if not calls:
            return {"content": text}, finish_reason
        fields = {"content": content if content.strip() else None, "tool_calls": [c.to_dict() for c in calls]}
        return fields, _finish(self.mode, finish_reason)

    def delta(self, text: str) -> list[Delta]:
        """The deltas a streamed piece of text gives (content, or tool-call pieces)."""
        if self.mode is None:
            return [Content(text)] if text else []
        deltas: list[Delta] = []
        if self.mode == "named":
            if not self._num_calls:
                call = ToolCall(self.tool_choice["function"]["name"], "")  # type: ignore[index]
                deltas.append(ToolCalls((call.start(0),)))
                self._num_calls = 1
            return deltas + ([ToolCalls((CallPiece(0, text),))] if text else [])
        if self.mode == "required":
            self._text += text
            return []
        content, calls = self._stream.feed(text)
        if content:
            deltas.append(Content(content))
        for call in calls:
            deltas.append(ToolCalls((call.start(self._num_calls),)))
            self._num_calls += 1
        return deltas

    def finish(self, finish_reason: str | None) -> tuple[list[Delta], str | None]:
        """The last deltas (what was held back) and the finish reason."""
        if self.mode == "required":
            calls = forced_calls(self._text, "required")
            if not calls:
                return [Content(self._text)], finish_reason
            self._num_calls = len(calls)
            return [ToolCalls(tuple(c.start(i) for i, c in enumerate(calls)))], _finish(self.mode, finish_reason)
        if self.mode == "hermes":
            rest = self._stream.finish()
            return ([Content(rest)] if rest else []), _finish(self.mode, finish_reason) if self._num_calls else finish_reason
        return [], _finish(self.mode, finish_reason) if self.mode else finish_reason


def _finish(mode: str | None, finish_reason: str | None) -> str | None:
    # NOTE: as OpenAI: a call the model chose (auto, required) ends with "tool_calls"; a forced
    # named call ends as the generation did ("stop").
    return "tool_calls" if mode != "named" and finish_reason == "stop" else finish_reason
