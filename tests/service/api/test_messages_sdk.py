"""Anthropic's Python SDK against a real tiny-model server: create, stream, count_tokens, and a tool
round trip whose call is forced (the tiny model's weights are random, so its input is the schema's
constrained JSON)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.server_process import ServerProcess

# NOTE: an enum keeps the random model's constrained input short.
WEATHER: Any = {"name": "get_weather", "description": "The weather in a city.", "input_schema": {
    "type": "object", "properties": {"city": {"enum": ["Oslo", "Tokyo"]}}, "required": ["city"],
    "additionalProperties": False}}
FORCED: Any = {"type": "tool", "name": "get_weather"}
QUESTION: Any = [{"role": "user", "content": "What is the weather in Tokyo?"}]


@pytest.fixture
def client(tiny_server: ServerProcess) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=tiny_server.base_url, api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def test_create_stream_and_count_tokens_agree(client: anthropic.Anthropic) -> None:
    body: Any = {"model": "tiny", "max_tokens": 8, "system": "Be brief.", "messages": QUESTION,
                 "extra_body": {"temperature": 0}}
    message = client.messages.create(**body)
    assert message.type == "message" and message.model == "tiny"
    assert message.stop_reason in ("end_turn", "max_tokens") and 0 < message.usage.output_tokens <= 8
    (block,) = message.content
    assert block.type == "text"
    with client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == block.text  # type: ignore[union-attr]
    assert final.stop_reason == message.stop_reason and final.usage.output_tokens == message.usage.output_tokens
    counted = client.messages.count_tokens(model="tiny", system="Be brief.", messages=QUESTION)
    for usage in (message.usage, final.usage):
        assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_a_tool_round_trip_with_a_streamed_call(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="tiny", max_tokens=40, messages=QUESTION, tools=[WEATHER], tool_choice=FORCED)
    (call,) = message.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.input["city"] in ("Oslo", "Tokyo")
    assert message.stop_reason == "tool_use"

    with client.messages.stream(model="tiny", max_tokens=40, messages=QUESTION, tools=[WEATHER],
                                tool_choice=FORCED) as stream:
        events = list(stream)
        final = stream.get_final_message()
    pieces = [e.delta.partial_json for e in events
              if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]  # type: ignore[union-attr]
    (streamed_call,) = final.content
    assert streamed_call.type == "tool_use" and json.loads("".join(pieces)) == streamed_call.input
    assert final.stop_reason == "tool_use"

    follow_up = client.messages.create(model="tiny", max_tokens=8, tools=[WEATHER], messages=[
        *QUESTION,
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]},
    ])
    assert follow_up.stop_reason in ("end_turn", "max_tokens", "tool_use") and follow_up.usage.output_tokens > 0
    counted = client.messages.count_tokens(model="tiny", tools=[WEATHER], messages=[
        *QUESTION,
        {"role": "assistant", "content": [call.model_dump()]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]},
    ])
    assert counted.input_tokens == follow_up.usage.input_tokens + (follow_up.usage.cache_read_input_tokens or 0)


def test_errors_reach_the_sdk_as_its_own_exceptions(client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-no-such-model", max_tokens=8, messages=QUESTION)
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model="tiny", max_tokens=8, messages=QUESTION, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "other"})
