"""The Hermes tool-call parser, whole and streamed cut at every position, and forced calls."""

from __future__ import annotations

import json

import pytest

from service.openai.response_bodies import chat_delta
from service.openai.tool_calls import ChoiceTools, HermesStream, forced_calls, forced_schema, parse_hermes

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo", "unit": "°C"}}\n</tool_call>'
SECOND = '<tool_call>{"name": "get_time", "arguments": {"zone": "JST"}}</tool_call>'
TEXTS = [
    CALL,
    "Let me check. " + CALL,
    CALL + "\n" + SECOND,
    "Before " + CALL + " between " + SECOND + " after",
    "<tool_call>{not json}</tool_call> then " + CALL,
    "a < b and <tool_ but no tag",
    "unclosed " + CALL[:-5],
]


def calls_of(calls: list) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_whole_text_gives_content_and_calls() -> None:
    assert calls_of(parse_hermes(CALL)[1]) == [("get_weather", {"city": "Tokyo", "unit": "°C"})]
    content, calls = parse_hermes("Before " + CALL + " between " + SECOND + " after")
    assert content == "Before  between  after" and [c.name for c in calls] == ["get_weather", "get_time"]
    content, calls = parse_hermes("<tool_call>{not json}</tool_call> then " + CALL)
    assert content == "<tool_call>{not json}</tool_call> then " and len(calls) == 1
    assert parse_hermes("a < b and <tool_ but no tag") == ("a < b and <tool_ but no tag", [])


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_cut_at_every_position_equals_the_whole(text: str) -> None:
    whole_content, whole_calls = parse_hermes(text)
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in cuts:
        stream = HermesStream()
        content = "".join(stream.feed(piece)[0] for piece in pieces) + stream.finish()
        assert content == whole_content, pieces
        assert calls_of(stream.calls) == calls_of(whole_calls), pieces


def test_held_back_text_never_leaks_a_tag_into_content() -> None:
    stream = HermesStream()
    assert stream.feed("Sure <tool") == ("Sure ", [])
    assert stream.feed("_call>{\"name\": \"f\", \"arguments\": {}}") == ("", [])
    content, calls = stream.feed("</tool_call>")
    assert content == "" and [c.name for c in calls] == ["f"]


def test_forced_calls_follow_their_schema() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
             {"type": "function", "function": {"name": "g"}}]
    named = forced_schema(tools, {"type": "function", "function": {"name": "f"}}, True)
    assert named["properties"]["x"] == {"type": "integer"}
    required = forced_schema(tools, "required", False)
    assert required["maxItems"] == 1 and [i["properties"]["name"] for i in required["items"]["anyOf"]] == [{"const": "f"}, {"const": "g"}]
    assert calls_of(forced_calls('[{"name": "f", "parameters": {"x": 1}}]', "required")) == [("f", {"x": 1})]
    assert calls_of(forced_calls('{"x": 2}', {"type": "function", "function": {"name": "f"}})) == [("f", {"x": 2})]


def test_a_streamed_forced_call_concatenates_to_the_whole_one() -> None:
    choice = {"type": "function", "function": {"name": "f"}}
    whole, finish = ChoiceTools("named", choice).whole('{"x": 12}', "stop")
    streamed = ChoiceTools("named", choice)
    deltas = [chat_delta(d) for piece in ['{"x"', ': 1', '2}'] for d in streamed.delta(piece)]
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas)
    assert arguments == whole["tool_calls"][0]["function"]["arguments"] and finish == "stop"
    assert deltas[0]["tool_calls"][0]["function"]["name"] == "f"
    required = ChoiceTools("required", "required")
    assert required.delta('[{"name": "f", "parameters": {}}]') == []
    (last,), finish = required.finish("stop")
    assert chat_delta(last)["tool_calls"][0]["function"]["name"] == "f" and finish == "tool_calls"
