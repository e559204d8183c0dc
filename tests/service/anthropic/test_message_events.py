"""An answer's typed steps as Anthropic's events, and as the whole Message they build: blocks in
order, their indices, stop_reason and usage."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from service.anthropic.message import message_base, stop_of
from service.anthropic.message_events import MessageEvents
from service.frontend.outputs import CompletionOutput, RequestOutput
from service.openai.deltas import AnswerStep, CallPiece, Content, Delta, Reasoning, ToolCalls, Usage
from service.openai.errors import APIError


def step(delta: Delta, num_tokens: int, finish_reason: str | None = None) -> AnswerStep:
    output = RequestOutput("r", None, [], [CompletionOutput(0, "", [], finish_reason=finish_reason)], finished=False)
    return AnswerStep(0, [delta], finish_reason, Usage(20, num_tokens, 16), output)


STEPS = [
    step(Reasoning("Hmm, "), 1), step(Reasoning("weather."), 2), step(Content("Looking."), 3),
    step(ToolCalls((CallPiece(0, "", "call_ab", "get_weather"),)), 4),
    step(ToolCalls((CallPiece(0, '{"city": '),)), 5), step(ToolCalls((CallPiece(0, '"Oslo"}'),)), 7, "tool_calls"),
]


async def steps() -> AsyncIterator[AnswerStep]:
    for each in STEPS:
        yield each


async def test_thinking_text_and_a_call_are_three_blocks_in_order() -> None:
    out = [event async for event in MessageEvents(message_base("msg_1", "m"), 20).stream(steps())]
    assert [(e["type"], e.get("index")) for e in out] == [
        ("message_start", None), ("ping", None),
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_delta", 2), ("content_block_stop", 2),
        ("message_delta", None), ("message_stop", None),
    ]
    # NOTE: message_start waits for the first output, which says how much of the prompt the prefix cache held.
    assert out[0]["message"]["usage"] == {"input_tokens": 4, "output_tokens": 0, "cache_creation_input_tokens": 0,
                                          "cache_read_input_tokens": 16}
    assert out[0]["message"]["content"] == []
    assert [e["content_block"]["type"] for e in out if e["type"] == "content_block_start"] == ["thinking", "text",
                                                                                              "tool_use"]
    assert out[9]["content_block"] == {"type": "tool_use", "id": "toolu_ab", "name": "get_weather", "input": {}}
    partial = "".join(e["delta"]["partial_json"] for e in out if e.get("delta", {}).get("type") == "input_json_delta")
    assert json.loads(partial) == {"city": "Oslo"}
    assert out[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert out[-2]["usage"] == {"input_tokens": 4, "output_tokens": 7, "cache_creation_input_tokens": 0,
                                "cache_read_input_tokens": 16}


async def test_a_whole_answer_is_the_message_its_events_build_with_parsed_input() -> None:
    message = await MessageEvents(message_base("msg_1", "m"), 20).answer(steps())
    assert message["content"] == [
        {"type": "thinking", "thinking": "Hmm, weather.", "signature": ""}, {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "toolu_ab", "name": "get_weather", "input": {"city": "Oslo"}},
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
