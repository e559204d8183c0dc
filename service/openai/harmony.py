"""gpt-oss's harmony chat format: its answer read into reasoning, content and tool calls, whole or
while streaming, and the chat's messages shaped the way its template reads them.

An answer is a sequence of messages, each a header and a body:

    <|channel|>analysis<|message|>The user asks the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>

The first header follows the prompt's own `<|start|>assistant`. A header names the channel
(analysis: reasoning; final, or commentary without a recipient: content) and, for a call, its
recipient `to=functions.NAME`, before or after the channel. A body ends with `<|end|>`, or with
`<|call|>` / `<|return|>`, which also end generation. As llama.cpp's parser: analysis is the
reasoning, a call to another recipient (a built-in tool) is dropped, and output that is not
harmony at all is content.
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from service.openai.tool_calls import partial_prefix

START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
# NOTE: they end the answer (vLLM stops on them: its stop tokens for the assistant's actions).
STOP_TOKENS = ("<|return|>", "<|call|>")
# NOTE: where a constraint on the answer (response_format) starts holding, as vLLM's gpt-oss parser sees it.
FINAL_HEADER = f"{CHANNEL}final{MESSAGE}"
_ENDS = ("<|end|>", *STOP_TOKENS, "<|endoftext|>")
# NOTE: what ends a body: an end, or a new header begun without one.
_BREAKS = (*_ENDS, START, CHANNEL)
# NOTE: how a header can begin; an answer that begins otherwise is not harmony (all content).
_OPENERS = (START, CHANNEL, MESSAGE, "<|constrain|>", "to=")
# NOTE: a header longer than this without its `<|message|>` is not one (held back no longer).
MAX_HEADER_CHARS = 256
_CHANNEL_NAME = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


def is_harmony_template(chat_template: str | None) -> bool:
    """Whether a chat template renders harmony (llama.cpp's test: it writes `<|channel|>`)."""
    return chat_template is not None and CHANNEL in chat_template


class Piece(NamedTuple):
    """A run of one kind of the answer: "reasoning", "content", "call" (its text the function's
    name; a new call) or "arguments" (of the last call)."""

    kind: str
    text: str


class HarmonyStream:
    """Reads a streamed answer into pieces: text that may be part of a header or of a special token
    is held back until it is known."""

    def __init__(self) -> None:
        self._pending = ""
        self._kind: str | None = None  # the open body's kind ("drop": read, not shown); None in a header
        self._is_first = True
        self._is_breaking = True  # NOTE: False right after a header given up on, so the loop goes on
        self.has_reasoned = False

    def feed(self, delta: str) -> list[Piece]:
        """The pieces `delta` makes sure of."""
        self._pending += delta
        pieces: list[Piece] = []
        while self._pending and (self._read_body(pieces) if self._kind else self._read_header(pieces)):
            pass
        return _merged(pieces)

    def finish(self) -> list[Piece]:
        """What is held back: an open body's rest, or a header cut short (dropped, unless the answer
        was not harmony at all)."""
        rest, self._pending = self._pending, ""
        if self._kind is None:
            is_plain = self._is_first and rest.strip() and not any(t in rest for t in _OPENERS)
            return [Piece("content", rest)] if is_plain else []
        return _merged(self._body_pieces(rest))

    def _read_header(self, pieces: list[Piece]) -> bool:
        """Reads a whole header (opening its body); False when it is not all here yet."""
        end = self._pending.find(MESSAGE)
        opening = self._pending.lstrip()
        is_opener = any(t.startswith(opening) or opening.startswith(t) for t in _OPENERS)
        size = len(self._pending) if end == -1 else end
        if (self._is_first and opening and not is_opener) or size > MAX_HEADER_CHARS:
            self._kind, self._is_breaking, self._is_first = "content", False, False
            return True
        if end == -1:
            return False
        header, self._pending = self._pending[:end], self._pending[end + len(MESSAGE):]
        self._kind, name = _header_kind(header)
        self._is_first, self._is_breaking = False, True
        if self._kind == "call":
            pieces.append(Piece("call", name))
        self.has_reasoned |= self._kind == "reasoning"
        return True

    def _read_body(self, pieces: list[Piece]) -> bool:
        """Reads the open body up to its end (then a header comes); False when its end is not here yet."""
        text = self._pending
        start = 0 if self._is_breaking else 1
        self._is_breaking = True
        found = [(i, token) for token in _BREAKS if (i := text.find(token, start)) != -1]
        if not found:
            keep = max(partial_prefix(text, token) for token in _BREAKS)
            pieces += self._body_pieces(text[: len(text) - keep])
            self._pending = text[len(text) - keep:]
            return False
        index, token = min(found)
        pieces += self._body_pieces(text[:index])
        # NOTE: a new header begun without an end keeps its opening token; it is part of the header.
        self._pending = text[index + len(token):] if token in _ENDS else text[index:]
        self._kind = None
        return True

    def _body_pieces(self, text: str) -> list[Piece]:
        if not text or self._kind == "drop":
            return []
        return [Piece("arguments" if self._kind == "call" else str(self._kind), text)]


def _header_kind(header: str) -> tuple[str, str]:
    """(the body's kind, the function's name for a call) of a header (from its last `<|start|>`)."""
    header = header[header.rfind(START) + len(START):] if START in header else header
    role = re.split(r"<\||\s*to=", header, maxsplit=1)[0].strip()
    channels = _CHANNEL_NAME.findall(header)
    recipients = [r for r in _RECIPIENT.findall(header) if r != "assistant"]
    if role not in ("", "assistant"):
        return "drop", ""  # NOTE: a message the model wrote as another role (a tool's answer): not its own
    if recipients:
        name = recipients[-1].removeprefix("functions.")
        is_function = recipients[-1].startswith("functions.") and name
        return ("call", name) if is_function else ("drop", "")
    return ("reasoning" if channels and channels[-1] == "analysis" else "content"), ""


def _merged(pieces: list[Piece]) -> list[Piece]:
    """Runs of the same kind joined (a call's name never: each is a call of its own)."""
    merged: list[Piece] = []
    for piece in pieces:
        if merged and piece.kind == merged[-1].kind and piece.kind != "call":
            merged[-1] = Piece(piece.kind, merged[-1].text + piece.text)
        else:
            merged.append(piece)
    return merged


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as the harmony template reads them (as llama.cpp gives them to it): an assistant's
    reasoning as its `thinking` (the content of one that calls then left out: the template takes
    one or the other), and its calls' arguments as JSON values, which the template writes with
    `tojson` (a JSON string would come out quoted)."""
    shaped = []
    for message in messages:
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(reasoning, str) and "thinking" not in message:
            message = {**message, "thinking": reasoning}
            if calls:
                message.pop("content", None)
        if isinstance(calls, list):
            message = {**message, "tool_calls": [_call_with_value(call) for call in calls]}
        shaped.append(message)
    return shaped


def template_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools as the harmony template reads them: each function with a description, which it
    writes as a comment (one without it would fail to render)."""
    return [
        {**tool, "function": {"description": "", **tool["function"]}} if isinstance(tool.get("function"), dict) else tool
        for tool in tools
    ]


def _call_with_value(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(arguments := function.get("arguments"), str):
        return call
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return call
    return {**call, "function": {**function, "arguments": value}}
