"""POST /v1/responses in process, on a fake engine, through the official OpenAI SDK (its Responses
client) and raw HTTP: the Response object, the event sequence, input items, tools, reasoning,
text.format and errors naming the Responses field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel

from service.model_files.tokenizer import Tokenizer
from tests.service.api.fake_engine import MAX_MODEL_LEN, FakeEngineClient

RESPONSES = "/v1/responses"
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture
async def api(serve: Any, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app in process on the fake engine, keeping responses in a file of the test's own."""
    async with serve(responses_store=str(tmp_path / "responses.sqlite")) as client:
        yield client


def sdk_of(api: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """The OpenAI SDK talking to the app in process through `api`'s transport."""
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=api, max_retries=0)


def prompt_text(engine: FakeEngineClient, tokenizer: Tokenizer) -> str:
    return tokenizer.decode(engine.requests[-1].prompt_token_ids, skip_special_tokens=False)


async def test_a_text_input_gets_a_response_with_the_answer_and_usage(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    client = sdk_of(api)
    response = await client.responses.create(model="fake-alias", input="Name a colour.", max_output_tokens=6,
                                             extra_body={"ignore_eos": True})
    assert response.object == "response" and response.id.startswith("resp_") and response.model == "fake-alias"
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == engine.output_text(6)
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    num_prompt_tokens = len(engine.requests[-1].prompt_token_ids)
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (
        num_prompt_tokens, 6, num_prompt_tokens + 6)
    assert response.usage.input_tokens_details.cached_tokens == 0
    assert response.max_output_tokens == 6 and response.store is True and response.tools == []

    engine.token_ids = [*engine.token_ids[:3], engine.eos_token_id]
    finished = await client.responses.create(model="fake", input="Name a colour.")
    assert finished.status == "completed" and finished.incomplete_details is None
    assert finished.output_text == engine.output_text(3)


async def test_instructions_and_input_items_render_through_the_chat_template(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Oslo?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "-3 C, snow"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold."}]},
        {"role": "user", "content": "And tomorrow?"},
    ]
    response = await api.post(RESPONSES, json={"input": items, "instructions": "You are a weather bot.",
                                               "tools": [WEATHER], "max_output_tokens": 2})
    assert response.status_code == 200, response.text
    prompt = prompt_text(engine, tokenizer)
    for part in ("<|im_start|>system\nYou are a weather bot.<|im_end|>", "<|im_start|>system\nBe brief.<|im_end|>",
                 "<|im_start|>user\nWeather in Oslo?<|im_end|>", "<|im_start|>tool\n-3 C, snow<|im_end|>",
                 "<|im_start|>assistant\nCold.<|im_end|>", "<|im_start|>user\nAnd tomorrow?<|im_end|>"):
        assert part in prompt, (part, prompt)
    assert prompt.endswith("<|im_start|>assistant\n")


async def test_a_stream_is_the_responses_event_sequence_and_adds_up_to_the_whole(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    client = sdk_of(api)
    whole = await client.responses.create(model="fake", input="Hi", max_output_tokens=5, extra_body={"ignore_eos": True})
    stream = await client.responses.create(model="fake", input="Hi", max_output_tokens=5, stream=True,
                                           extra_body={"ignore_eos": True})
    events = [event async for event in stream]
    kinds = [event.type for event in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * 5,
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete",
    ]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert "".join(deltas) == whole.output_text == engine.output_text(5)
    final = events[-1].response
    assert final.output_text == whole.output_text and final.usage == whole.usage
    item_ids = {event.item_id for event in events if hasattr(event, "item_id")}
    assert item_ids == {final.output[0].id}

    # The SSE framing: each event numbered, named by its type; no [DONE] (OpenAI's Responses streams
    # end with their last event).
    raw = await api.post(RESPONSES, json={"input": "Hi", "max_output_tokens": 2, "stream": True})
    frames = raw.text.split("\n\n")[:-1]
    for event_id, frame in enumerate(frames):
        id_line, name, data = frame.split("\n")
        assert id_line == f"id: {event_id}"
        assert name == f"event: {json.loads(data.removeprefix('data: '))['type']}"
    assert "[DONE]" not in raw.text


async def test_a_forced_function_call_round_trip(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    engine.token_ids = [*tokenizer.encode('{"city": "Tokyo"}'), engine.eos_token_id]
    client = sdk_of(api)
    named = {"type": "function", "name": "get_weather"}
    response = await client.responses.create(model="fake", input="Weather in Tokyo?", tools=[WEATHER],  # type: ignore[list-item]
                                             tool_choice=named)  # type: ignore[arg-type]
    constraint = engine.requests[-1].sampling_params.structured_output
    assert constraint is not None and json.loads(constraint.spec) == WEATHER["parameters"]
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == '{"city": "Tokyo"}'
    assert call.call_id.startswith("call_") and response.status == "completed"

    stream = await client.responses.create(model="fake", input="Weather in Tokyo?", tools=[WEATHER],  # type: ignore[list-item]
                                           tool_choice=named, stream=True)  # type: ignore[arg-type]
    events = [event async for event in stream]
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert "".join(pieces) == done.arguments == call.arguments
    assert not any(e.type == "response.output_text.delta" for e in events)

    # The call's result goes back as input items, and the model answers with text.
    engine.token_ids = [*tokenizer.encode("It is sunny."), engine.eos_token_id]
    follow_up = await client.responses.create(model="fake", tools=[WEATHER], input=[  # type: ignore[list-item]
        {"role": "user", "content": "Weather in Tokyo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
    ])
    assert follow_up.output_text == "It is sunny."
    assert engine.requests[-1].sampling_params.structured_output is None
    assert "sunny, 21 C" in prompt_text(engine, tokenizer)


async def test_reasoning_and_parsed_calls_are_their_own_items(
    serve: Any, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    text = ('<think>The user wants the weather.</think>Let me look. '
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</tool_call>')
    engine.token_ids = [*tokenizer.encode(text), engine.eos_token_id]
    async with serve(reasoning_parser="qwen3", tool_call_parser="hermes", responses_store="off") as api:
        client = sdk_of(api)
        whole = await client.responses.create(model="fake", input="Weather?", tools=[WEATHER])  # type: ignore[list-item]
        assert [item.type for item in whole.output] == ["reasoning", "message", "function_call"]
        reasoning, message, call = whole.output
        assert reasoning.content is not None and reasoning.content[0].text == "The user wants the weather."  # type: ignore[union-attr]
        assert whole.output_text == "Let me look. "
        assert call.arguments == '{"city": "Tokyo"}'  # type: ignore[union-attr]
        assert whole.usage is not None and whole.usage.output_tokens_details.reasoning_tokens == len(
            tokenizer.encode("The user wants the weather."))
        stream = await client.responses.create(model="fake", input="Weather?", tools=[WEATHER], stream=True)  # type: ignore[list-item]
        events = [event async for event in stream]
        thinking = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
        answer = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert (thinking, answer) == ("The user wants the weather.", "Let me look. ")
        final = events[-1].response
        assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
        assert final.output[2].arguments == call.arguments  # type: ignore[union-attr]


class Colour(BaseModel):
    name: str


async def test_text_format_constrains_the_answer_and_parse_reads_it(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    engine.token_ids = [*tokenizer.encode('{"name": "blue"}'), engine.eos_token_id]
    parsed = await sdk_of(api).responses.parse(model="fake", input="A colour as JSON.", text_format=Colour)
    constraint = engine.requests[-1].sampling_params.structured_output
    assert constraint is not None and constraint.kind == "json"
    assert json.loads(constraint.spec)["properties"] == {"name": {"title": "Name", "type": "string"}}
    assert parsed.output_parsed == Colour(name="blue")
    await api.post(RESPONSES, json={"input": "x", "text": {"format": {"type": "json_object"}}})
    assert engine.requests[-1].sampling_params.structured_output.kind == "json_object"  # type: ignore[union-attr]


async def test_logprobs_come_with_the_text_when_included(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    body = {"input": "Hi", "max_output_tokens": 3, "ignore_eos": True, "top_logprobs": 2,
            "include": ["message.output_text.logprobs"]}
    whole = (await api.post(RESPONSES, json=body)).json()
    logprobs = whole["output"][0]["content"][0]["logprobs"]
    assert [entry["token"] for entry in logprobs] == [engine.tokenizer.decode([t]) for t in engine.output_ids(3)]
    assert all(len(entry["top_logprobs"]) == 2 for entry in logprobs)
    plain = (await api.post(RESPONSES, json={**body, "include": []})).json()
    assert plain["output"][0]["content"][0]["logprobs"] == []


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"conversation": "conv_1"}, "conversation", "previous_response_id"),
    ({"background": True, "store": False}, "background", "store"),
    ({"background": True, "stream": True}, "stream", "poll"),
    ({"previous_response_id": "resp_1"}, "previous_response_id", "not found"),
    ({"include": ["file_search_call.results"]}, "include.0", "not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools.0", "function tools"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice", "nope"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0", "text models"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0.type", "item_reference"),
    ({"input": [{"role": "wizard", "content": "hi"}]}, "input.0.role", "wizard"),
    ({"input": [{"role": "system", "content": "hi"}]}, "input", "no message"),
    ({"input": []}, "input", "input"),
    ({"max_output_tokens": 0}, "max_output_tokens", "max_output_tokens"),
    ({"max_output_tokens": MAX_MODEL_LEN}, "max_output_tokens", "context"),
    ({"temperature": -1}, "temperature", "temperature"),
    ({"top_logprobs": 50, "include": ["message.output_text.logprobs"]}, "top_logprobs", "top_logprobs"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema", "schema"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format", "yaml"),
    ({"reasoning": {"effort": "extreme"}}, "reasoning.effort", "reasoning.effort"),
    ({"model": "gpt-5"}, "model", "gpt-5"),
])
async def test_bad_requests_get_a_400_naming_the_responses_field(
    api: httpx.AsyncClient, engine: FakeEngineClient, body: dict[str, Any], param: str, words: str
) -> None:
    response = await api.post(RESPONSES, json={"input": "Hi", **body})
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert engine.requests == []



async def test_an_engine_that_dies_mid_stream_ends_it_with_an_error_event(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.die_after(3)
    raw = await api.post(RESPONSES, json={"input": "Hi", "max_output_tokens": 50, "stream": True, "ignore_eos": True})
    _, last_name, last_data = raw.text.split("\n\n")[:-1][-1].split("\n")
    error = json.loads(last_data.removeprefix("data: "))
    assert last_name == "event: error" and error["type"] == "error" and error["error"]["type"] == "server_error"
    assert "response.output_text.delta" in raw.text
