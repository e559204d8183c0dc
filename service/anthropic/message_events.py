"""A Message from the answer's typed steps (one choice): Anthropic's event sequence, and the Message
it adds up to (the whole answer of a request that does not stream). message_start, a ping, then each
content block (thinking, text, tool_use) opened by content_block_start, filled by content_block_delta (thinking_delta, text_delta, input_json_delta)
and closed by content_block_stop; message_delta with the stop_reason and usage; message_stop.

message_start waits for the engine's first output, which says how much of the prompt the prefix
cache held: its usage counts as message_delta's does (`input_tokens` the uncached part,
`cache_read_input_tokens` the cached one), as Anthropic's does."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from service.anthropic.errors import anthropic_error_type
from service.anthropic.message import message_usage, stop_of, tool_input, tool_use_id
from service.openai.answer_events import AnswerEvents, Event
from service.openai.deltas import AnswerStep, CallPiece, Usage
from service.openai.errors import APIError

logger = logging.getLogger(__name__)


class MessageEvents(AnswerEvents):
    """The Messages events of an answer's steps, block by block, and the Message they add up to."""

    def __init__(self, base: dict[str, Any], num_prompt_tokens: int) -> None:
        super().__init__()
        self.base = base
        self.num_prompt_tokens = num_prompt_tokens
        self.blocks: list[dict[str, Any]] = []  # NOTE: the Message's content so far (a tool_use's input whole at the end)
        self.arguments: dict[int, str] = {}  # a tool_use block's input JSON so far, by block index
        self.open_kind: str | None = None  # the open block's delta kind
        self.has_tool_use = False

    def started(self) -> list[Event]:
        """message_start (its usage: the prompt's cached tokens are known from the first output) and a ping."""
        usage = message_usage(self.usage or Usage(self.num_prompt_tokens, 0, 0)) | {"output_tokens": 0}
        return [{"type": "message_start", "message": self.base | {"usage": usage}}, {"type": "ping"}]

    def reasoning(self, text: str) -> list[Event]:
        return self._delta("thinking_delta", {"type": "thinking", "thinking": "", "signature": ""}, "thinking", text)

    def content(self, text: str, step: AnswerStep) -> list[Event]:
        return self._delta("text_delta", {"type": "text", "text": ""}, "text", text)

    def call(self, piece: CallPiece) -> list[Event]:
        events = []
        if piece.call_id is not None:
            block = {"type": "tool_use", "id": tool_use_id(piece.call_id), "name": piece.name or "", "input": {}}
            events += self._open("input_json_delta", block)
            self.arguments[self.num_blocks - 1] = ""
            self.has_tool_use = True
        if piece.arguments and self.open_kind == "input_json_delta":
            self.arguments[self.num_blocks - 1] += piece.arguments
            delta = {"type": "input_json_delta", "partial_json": piece.arguments}
            events.append({"type": "content_block_delta", "index": self.num_blocks - 1, "delta": delta})
        return events

    def closing(self) -> list[Event]:
        """The open block's end, message_delta (stop_reason, usage), message_stop."""
        stop_reason, stop_sequence = stop_of(self.finish_reason, self.stop_reason, self.has_tool_use)
        usage = message_usage(self.usage) if self.usage is not None else {"output_tokens": 0}
        message_delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                         "usage": usage}
        events = [] if self.is_started else self.started()
        self.is_started = True
        return [*events, *self._close(), message_delta, {"type": "message_stop"}]

    def whole(self) -> dict[str, Any]:
        """The Message: its blocks (each tool_use's input parsed), stop_reason and usage."""
        content = [block | {"input": tool_input(self.arguments[index])} if index in self.arguments else block
                   for index, block in enumerate(self.blocks)]
        stop_reason, stop_sequence = stop_of(self.finish_reason, self.stop_reason, self.has_tool_use)
        usage = message_usage(self.usage) if self.usage is not None else {"output_tokens": 0}
        return self.base | {"content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def _delta(self, kind: str, block: dict[str, Any], name: str, text: str) -> list[Event]:
        events = [] if self.open_kind == kind else self._open(kind, block)
        self.blocks[-1][name] += text
        return [*events, {"type": "content_block_delta", "index": self.num_blocks - 1, "delta": {"type": kind, name: text}}]

    def _open(self, kind: str, block: dict[str, Any]) -> list[Event]:
        events = self._close()
        self.open_kind = kind
        self.blocks.append(dict(block))
        return [*events, {"type": "content_block_start", "index": self.num_blocks - 1, "content_block": block}]

    def _close(self) -> list[Event]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [{"type": "content_block_stop", "index": self.num_blocks - 1}]


async def message_events(steps: AsyncIterator[AnswerStep], events: MessageEvents) -> AsyncIterator[Event]:
    """The stream's events; a failure ends it with an error event of Anthropic's types."""
    try:
        async for event in events.stream(steps):
            yield event
    except APIError as error:
        error.error_type = anthropic_error_type(error.status_code)
        raise
    except Exception as error:
        logger.warning("message stream ended by error: %s", error)
        raise APIError(str(error), 500, error_type="api_error") from error
