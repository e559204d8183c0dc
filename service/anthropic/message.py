"""An Anthropic Message made from the chat answer that produced it: its content blocks (thinking,
text, tool_use with the parsed input), its stop_reason and stop_sequence, and its usage."""

from __future__ import annotations

import json
import uuid
from typing import Any

from service.openai.errors import APIError


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def tool_use_id(call_id: str) -> str:
    """A chat tool call's id as Anthropic's (`toolu_...`)."""
    return f"toolu_{call_id.removeprefix('call_')}"


def message_base(message_id: str, model: str) -> dict[str, Any]:
    """The Message before any content: what message_start carries."""
    return {
        "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
    }


def stop_of(finish_reason: str | None, stop_reason: int | str | None, has_tool_use: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a chat choice's end: a call made ends in "tool_use" (a
    forced one too, as Anthropic's), a stop string in "stop_sequence" naming it."""
    if finish_reason == "abort":
        raise APIError("The request was aborted before it finished.", 500, error_type="api_error")
    if finish_reason == "length":
        return "max_tokens", None
    if has_tool_use:
        return "tool_use", None
    if isinstance(stop_reason, str):
        return "stop_sequence", stop_reason
    return "end_turn", None


def message_usage(chat_usage: dict[str, Any]) -> dict[str, Any]:
    """The chat's usage in Anthropic's names: `input_tokens` are the prompt tokens the prefix cache
    did not hold (`cache_read_input_tokens`), so the two add up to the prompt, as Anthropic counts."""
    num_cached_tokens = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return {
        "input_tokens": chat_usage["prompt_tokens"] - num_cached_tokens,
        "output_tokens": chat_usage["completion_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": num_cached_tokens,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as its input object ({} for arguments cut short by max_tokens)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def whole_message(base: dict[str, Any], chat: dict[str, Any]) -> dict[str, Any]:
    """The Message of a whole chat.completion body (one choice)."""
    (choice,) = chat["choices"]
    message = choice["message"]
    content: list[dict[str, Any]] = []
    if message.get("reasoning"):
        content.append({"type": "thinking", "thinking": message["reasoning"], "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        content.append({"type": "tool_use", "id": tool_use_id(call["id"]), "name": function["name"],
                        "input": tool_input(function["arguments"])})
    has_tool_use = bool(message.get("tool_calls"))
    stop_reason, stop_sequence = stop_of(choice["finish_reason"], choice["stop_reason"], has_tool_use)
    return base | {"content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
                   "usage": message_usage(chat["usage"])}
