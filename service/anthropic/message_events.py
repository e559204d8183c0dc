"""A streamed Message: Anthropic's event sequence made from the chat's chunks (one choice, usage
last). message_start, a ping, then each content block (thinking, text, tool_use) opened by
content_block_start, filled by content_block_delta (thinking_delta, text_delta, input_json_delta)
and closed by content_block_stop; message_delta with the stop_reason and usage; message_stop.

message_start waits for the engine's first output, which says how much of the prompt the prefix
cache held: its usage counts as message_delta's does (`input_tokens` the uncached part,
`cache_read_input_tokens` the cached one), as Anthropic's does."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from service.anthropic.errors import anthropic_error_type
from service.anthropic.message import message_usage, stop_of, tool_use_id
from service.frontend.outputs import RequestOutput
from service.openai.errors import APIError

logger = logging.getLogger(__name__)


class MessageEvents:
    """Turns a chat stream's chunks into the Messages events, block by block."""

    def __init__(self, base: dict[str, Any], num_prompt_tokens: int) -> None:
        self.base = base
        self.num_prompt_tokens = num_prompt_tokens
        self.num_blocks = 0
        self.open_kind: str | None = None  # the open block's delta kind
        self.has_tool_use = False
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.usage: dict[str, Any] | None = None
        self.num_cached_tokens: int | None = None  # known from the engine's first output
        self.is_started = False

    async def watch(self, outputs: AsyncIterator[tuple[int, RequestOutput]]) -> AsyncIterator[tuple[int, RequestOutput]]:
        """`outputs`, noting from the first how many of the prompt's tokens the prefix cache held."""
        async for index, output in outputs:
            if self.num_cached_tokens is None:
                self.num_cached_tokens = output.num_cached_tokens
            yield index, output

    def opening(self) -> list[dict[str, Any]]:
        """message_start and a ping, once."""
        if self.is_started:
            return []
        self.is_started = True
        num_cached_tokens = self.num_cached_tokens or 0
        usage = {"input_tokens": self.num_prompt_tokens - num_cached_tokens, "output_tokens": 0,
                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": num_cached_tokens}
        return [{"type": "message_start", "message": self.base | {"usage": usage}}, {"type": "ping"}]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat chunk (message_start first, once the first output came)."""
        if chunk.get("usage") is not None and not chunk["choices"]:
            self.usage = chunk["usage"]
        events: list[dict[str, Any]] = self.opening() if self.num_cached_tokens is not None else []
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning"):
                events += self._delta("thinking_delta", {"type": "thinking", "thinking": "", "signature": ""},
                                      thinking=delta["reasoning"])
            if delta.get("content"):
                events += self._delta("text_delta", {"type": "text", "text": ""}, text=delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason, self.stop_reason = choice["finish_reason"], choice.get("stop_reason")
        return events

    def closing(self) -> list[dict[str, Any]]:
        """The open block's end, message_delta (stop_reason, usage), message_stop."""
        stop_reason, stop_sequence = stop_of(self.finish_reason, self.stop_reason, self.has_tool_use)
        usage = message_usage(self.usage) if self.usage is not None else {"output_tokens": 0}
        message_delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                         "usage": usage}
        return [*self.opening(), *self._close(), message_delta, {"type": "message_stop"}]

    def _delta(self, kind: str, block: dict[str, Any], **fields: Any) -> list[dict[str, Any]]:
        events = [] if self.open_kind == kind else self._open(kind, block)
        return [*events, {"type": "content_block_delta", "index": self.num_blocks - 1, "delta": {"type": kind, **fields}}]

    def _call_delta(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        function = call.get("function") or {}
        events = []
        if "id" in call:
            block = {"type": "tool_use", "id": tool_use_id(call["id"]), "name": function.get("name", ""), "input": {}}
            events += self._open("input_json_delta", block)
            self.has_tool_use = True
        arguments = function.get("arguments") or ""
        if arguments and self.open_kind == "input_json_delta":
            delta = {"type": "input_json_delta", "partial_json": arguments}
            events.append({"type": "content_block_delta", "index": self.num_blocks - 1, "delta": delta})
        return events

    def _open(self, kind: str, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self.open_kind = kind
        self.num_blocks += 1
        return [*events, {"type": "content_block_start", "index": self.num_blocks - 1, "content_block": block}]

    def _close(self) -> list[dict[str, Any]]:
        if self.open_kind is None:
            return []
        self.open_kind = None
        return [{"type": "content_block_stop", "index": self.num_blocks - 1}]


async def message_events(chunks: AsyncIterator[dict[str, Any]], events: MessageEvents) -> AsyncIterator[dict[str, Any]]:
    """The stream's events; a failure ends it with an error event of Anthropic's types."""
    try:
        async for chunk in chunks:
            for event in events.feed(chunk):
                yield event
        for event in events.closing():
            yield event
    except APIError as error:
        error.error_type = anthropic_error_type(error.status_code)
        raise
    except Exception as error:
        logger.warning("message stream ended by error: %s", error)
        raise APIError(str(error), 500, error_type="api_error") from error
