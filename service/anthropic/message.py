"""An Anthropic Message's parts: its id, its base (what message_start carries), its stop_reason and
stop_sequence from the answer's end, its usage, a tool_use's id and input."""

from __future__ import annotations

import json
import uuid
from typing import Any

from service.openai.deltas import Usage
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


def message_usage(usage: Usage) -> dict[str, Any]:
    """An answer's usage in Anthropic's names: `input_tokens` are the prompt tokens the prefix cache
    did not hold (`cache_read_input_tokens`), so the two add up to the prompt, as Anthropic counts."""
    return {
        "input_tokens": usage.num_prompt_tokens - usage.num_cached_tokens,
        "output_tokens": usage.num_completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.num_cached_tokens,
    }


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as its input object ({} for arguments cut short by max_tokens)."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
