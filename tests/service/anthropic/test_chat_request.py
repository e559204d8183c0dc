"""A Messages body as the chat request it is answered as: system, turns with tool blocks, tools,
tool_choice, thinking and output_config."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.anthropic.chat_request import to_chat_request
from service.anthropic.protocol import CountTokensRequest, MessagesRequest
from service.openai.errors import APIError, validate_body

WEATHER = {"name": "get_weather", "description": "The weather.", "input_schema": {"type": "object"}}


def chat_of(**body: Any) -> dict[str, Any]:
    request = validate_body({"model": "m", "max_tokens": 9, **body}, MessagesRequest)
    request.check_supported()
    return to_chat_request(request).model_dump(exclude_unset=True)


def test_system_blocks_and_tool_turns_become_chat_messages() -> None:
    chat = chat_of(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "They want weather.", "signature": "s"},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "-3 C"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "down", "is_error": True},
            {"type": "text", "text": "And tomorrow?"},
        ]},
        {"role": "system", "content": [{"type": "text", "text": "Tools may be slow."}]},
    ])
    messages = [{key: value for key, value in m.items() if value is not None} for m in chat["messages"]]
    assert messages == [
        {"role": "system", "content": "Be brief.\n\nBe kind."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "-3 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: down"},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "system", "content": "Tools may be slow."},
    ]
    assert json.loads(messages[2]["tool_calls"][0]["function"]["arguments"]) == {"city": "Oslo"}


@pytest.mark.parametrize(("choice", "chat_choice", "is_parallel"), [
    ({"type": "auto"}, "auto", True),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", False),
    ({"type": "tool", "name": "get_weather"}, {"type": "function", "function": {"name": "get_weather"}}, True),
    ({"type": "none"}, "none", True),
])
def test_tools_and_tool_choice_are_the_chats(choice: dict[str, Any], chat_choice: Any, is_parallel: bool) -> None:
    chat = chat_of(messages=[{"role": "user", "content": "?"}], tools=[WEATHER], tool_choice=choice)
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}, "description": "The weather."}}]
    assert chat["tool_choice"] == chat_choice and chat["parallel_tool_calls"] is is_parallel


def test_sampling_thinking_and_output_config_are_the_chats() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    chat = chat_of(messages=[{"role": "user", "content": "?"}], stop_sequences=["END"], temperature=0.3, top_k=5,
                   stream=True, thinking={"type": "disabled"}, output_config={
                       "format": {"type": "json_schema", "schema": schema}, "effort": "max"})
    assert (chat["max_tokens"], chat["stop"], chat["temperature"], chat["top_k"]) == (9, ["END"], 0.3, 5)
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["chat_template_kwargs"] == {"enable_thinking": False} and chat["include_reasoning"] is False
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    assert chat["reasoning_effort"] == "xhigh"


def test_a_count_tokens_body_is_a_chat_of_one_token() -> None:
    body = validate_body({"model": "m", "messages": [{"role": "user", "content": "?"}]}, CountTokensRequest)
    chat = to_chat_request(body)
    assert chat.max_tokens == 1 and not chat.stream


@pytest.mark.parametrize(("body", "param"), [
    ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice.name"),
])
def test_what_cannot_be_honoured_is_a_400_naming_it(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as caught:
        chat_of(messages=[{"role": "user", "content": "?"}], **body)
    assert caught.value.param == param and caught.value.status_code == 400
