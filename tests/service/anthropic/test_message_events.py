"""A chat answer's chunks as Anthropic's events, and a whole chat answer as a Message: blocks in
order, their indices, stop_reason and usage."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.anthropic.message import message_base, stop_of, whole_message
from service.anthropic.message_events import MessageEvents
from service.openai.errors import APIError

USAGE = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27, "prompt_tokens_details": {"cached_tokens": 16}}


def chunk(delta: dict[str, Any], finish_reason: str | None = None, stop_reason: Any = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "stop_reason": stop_reason}]}


def test_thinking_text_and_a_call_are_three_blocks_in_order() -> None:
    events = MessageEvents(message_base("msg_1", "m"), 20)
    chunks = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"reasoning": "Hmm, "}), chunk({"reasoning": "weather."}),
        chunk({"content": "Looking."}),
        chunk({"tool_calls": [{"index": 0, "id": "call_ab", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}, "stop"),
        {"choices": [], "usage": USAGE},
    ]
    out = [*events.opening(), *(event for c in chunks for event in events.feed(c)), *events.closing()]
    assert [(e["type"], e.get("index")) for e in out] == [
        ("message_start", None), ("ping", None),
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("message_delta", None), ("message_stop", None),
    ]
    assert out[0]["message"]["usage"]["input_tokens"] == 20 and out[0]["message"]["content"] == []
    assert [e["content_block"]["type"] for e in out if e["type"] == "content_block_start"] == ["thinking", "text",
                                                                                              "tool_use"]
    assert out[9]["content_block"] == {"type": "tool_use", "id": "toolu_ab", "name": "get_weather", "input": {}}
    partial = "".join(e["delta"]["partial_json"] for e in out if e.get("delta", {}).get("type") == "input_json_delta")
    assert json.loads(partial) == {"city": "Oslo"}
    assert out[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert out[-2]["usage"] == {"input_tokens": 4, "output_tokens": 7, "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 16}


def test_a_whole_answer_is_a_message_with_parsed_input() -> None:
    chat = {"choices": [{"index": 0, "finish_reason": "tool_calls", "stop_reason": None, "message": {
        "role": "assistant", "content": "Looking.", "reasoning": "Hmm.",
        "tool_calls": [{"id": "call_x", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]}}],
        "usage": USAGE}
    message = whole_message(message_base("msg_1", "m"), chat)
    assert message["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": ""}, {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "toolu_x", "name": "f", "input": {"a": 1}},
    ]
    assert (message["stop_reason"], message["stop_sequence"]) == ("tool_use", None)
    assert message["usage"]["input_tokens"] + message["usage"]["cache_read_input_tokens"] == 20


@pytest.mark.parametrize(("finish_reason", "stop_reason", "has_tool_use", "expected"), [
    ("stop", None, False, ("end_turn", None)),
    ("stop", 2, False, ("end_turn", None)),
    ("stop", "END", False, ("stop_sequence", "END")),
    ("length", None, True, ("max_tokens", None)),
    ("stop", None, True, ("tool_use", None)),
])
def test_stop_reasons(finish_reason: str, stop_reason: Any, has_tool_use: bool, expected: tuple[str, Any]) -> None:
    assert stop_of(finish_reason, stop_reason, has_tool_use) == expected


def test_an_aborted_answer_is_an_api_error() -> None:
    with pytest.raises(APIError) as caught:
        stop_of("abort", None, False)
    assert caught.value.error_type == "api_error"
