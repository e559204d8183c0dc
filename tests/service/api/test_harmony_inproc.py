"""A gpt-oss model's harmony answers, in process on the fake engine, through OpenAI's SDK (chat and
Responses) and Anthropic's Messages: reasoning, content and calls whole and streamed, a tool round
trip rendered for the model, its stop tokens, and errors in OpenAI's shape.

NOTE: the model is the fake engine's (it answers with the token ids a test gives it, as the route
tests' seam has it) on a tokenizer that knows harmony's special tokens and gpt-oss's chat template:
SmolLM2's vocabulary with those tokens added, the template from llama.cpp's tree. Its default
parsers are "auto": harmony is chosen by the template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tokenizers import AddedToken
from tokenizers import Tokenizer as Backend

from service.model_files.tokenizer import Tokenizer
from service.openai.harmony import FINAL_HEADER
from tests.service.api.fake_engine import FakeEngineClient
from tests.service.api.openai_error import assert_openai_error

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
}}
ARGUMENTS = '{"location":"Paris"}'
CALLING = ("<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant<|channel|>commentary "
           f"to=functions.get_weather <|constrain|>json<|message|>{ARGUMENTS}<|call|>")
ANSWERING = ("<|channel|>analysis<|message|>It is 20 degrees.<|end|><|start|>assistant<|channel|>final<|message|>"
             "It is 20 °C in Paris.<|return|>")
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tokenizer(default_model_path: Path, llama_cpp_tree: Path) -> Tokenizer:
    """SmolLM2's tokenizer with harmony's special tokens, and gpt-oss's template (`<|return|>` its EOS)."""
    backend = Backend.from_str(Tokenizer.from_model(default_model_path).backend.to_str())
    backend.add_special_tokens([AddedToken(token, normalized=False, special=True) for token in HARMONY_TOKENS])
    template = (llama_cpp_tree / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    return Tokenizer(backend, template, {"eos_token": "<|return|>"})


def sdk_of(api: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """OpenAI's SDK talking to the app in process that `api` serves."""
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=api, max_retries=0)


def answer_with(engine: FakeEngineClient, tokenizer: Tokenizer, text: str) -> None:
    engine.token_ids = tokenizer.encode(text)


async def test_a_call_after_reasoning_is_a_tool_call_whole_and_streamed(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    answer_with(engine, tokenizer, CALLING)
    client = sdk_of(api)
    whole = await client.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    (choice,) = whole.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.function.name == "get_weather"  # type: ignore[union-attr]
    assert call.function.arguments == ARGUMENTS  # type: ignore[union-attr]
    assert (choice.message.model_extra or {})["reasoning_content"] == "The user wants the weather."
    params = engine.requests[-1].sampling_params
    assert {tokenizer.backend.token_to_id(t) for t in ("<|return|>", "<|call|>")} <= set(params.stop_token_ids)
    assert choice.model_extra and choice.model_extra["stop_reason"] == tokenizer.backend.token_to_id("<|call|>")

    stream = await client.chat.completions.create(model="fake", messages=ASK, tools=[WEATHER], stream=True)  # type: ignore[arg-type,list-item]
    chunks = [chunk async for chunk in stream]
    deltas = [c.delta for chunk in chunks for c in chunk.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == "The user wants the weather."
    assert not any(d.content for d in deltas)
    pieces = [call for d in deltas for call in d.tool_calls or []]
    assert pieces[0].id is not None and pieces[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert {p.index for p in pieces} == {0} and "".join(p.function.arguments or "" for p in pieces) == ARGUMENTS  # type: ignore[union-attr]
    assert [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason] == ["tool_calls"]


async def test_a_tool_round_trip_reaches_the_model_and_the_final_channel_is_the_content(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    answer_with(engine, tokenizer, ANSWERING)
    messages = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 20}'}]
    whole = await sdk_of(api).chat.completions.create(model="fake", messages=messages, tools=[WEATHER])  # type: ignore[arg-type,list-item]
    (choice,) = whole.choices
    assert (choice.message.content, choice.finish_reason, choice.message.tool_calls) == ("It is 20 °C in Paris.", "stop", None)
    assert (choice.message.model_extra or {})["reasoning"] == "It is 20 degrees."
    prompt = tokenizer.decode(engine.requests[-1].prompt_token_ids, skip_special_tokens=False)
    assert prompt.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        f"<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{ARGUMENTS.replace(':', ': ')}"
        '<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"{\\"temperature\\": 20}"'
        "<|end|><|start|>assistant"
    )
    assert "namespace functions" in prompt and "type get_weather" in prompt


async def test_responses_and_messages_carry_the_analysis_as_reasoning_and_thinking(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    answer_with(engine, tokenizer, CALLING)
    client = sdk_of(api)
    response = await client.responses.create(model="fake", input="Weather in Paris?", store=False, tools=[
        {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}])  # type: ignore[index]
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text == "The user wants the weather."
    assert call.type == "function_call" and (call.name, call.arguments) == ("get_weather", ARGUMENTS)
    anthropic_tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    body = {"model": "fake", "max_tokens": 200, "messages": ASK, "tools": [anthropic_tool],
            "thinking": {"type": "enabled", "budget_tokens": 100}}
    message = (await api.post("/v1/messages", json=body)).json()
    assert [block["type"] for block in message["content"]] == ["thinking", "tool_use"]
    assert message["content"][0]["thinking"] == "The user wants the weather."
    assert message["content"][1]["input"] == {"location": "Paris"} and message["stop_reason"] == "tool_use"
    streamed = await api.post("/v1/messages", json={**body, "stream": True})
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "The user wants the weather."
    assert json.loads("".join(d.get("partial_json", "") for d in deltas)) == {"location": "Paris"}


async def test_an_answer_constraint_holds_from_the_final_channel(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    answer_with(engine, tokenizer, "<|channel|>analysis<|message|>JSON.<|end|><|start|>assistant<|channel|>final"
                                   '<|message|>{"city": "Paris"}<|return|>')
    response = await api.post("/v1/chat/completions", json={"messages": ASK, "response_format": {"type": "json_object"}})
    assert response.json()["choices"][0]["message"]["content"] == '{"city": "Paris"}'
    constraint = engine.requests[-1].sampling_params.structured_output
    assert constraint is not None and constraint.is_reasoning
    assert constraint.reasoning_end_ids == tokenizer.encode(FINAL_HEADER)


@pytest.mark.parametrize("text", [
    "Plain text with no format at all.",
    "<|channel|>analysis<|message|>never ends",
    "<|end|><|start|><|call|><|message|><|constrain|>",
    " to=functions.get_weather<|channel|>commentary json<|message|>{\"location\":",
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{}<|end|>",
])
async def test_malformed_output_is_answered_whole_and_streamed(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer, text: str
) -> None:
    answer_with(engine, tokenizer, text)
    body = {"messages": ASK, "tools": [WEATHER], "max_tokens": 24}
    whole = await api.post("/v1/chat/completions", json=body)
    assert whole.status_code == 200, whole.text
    streamed = await api.post("/v1/chat/completions", json={**body, "stream": True})
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    assert '"error"' not in streamed.text


async def test_bad_requests_are_openai_errors(api: httpx.AsyncClient) -> None:
    forced = await api.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER], "tool_choice": "required"})
    assert_openai_error(forced, 400, "tool_choice")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert_openai_error(await api.post("/v1/chat/completions", json={"messages": ASK, "tools": [WEATHER], "tool_choice": named}),
                        400, "tool_choice")
    orphan = [*ASK, {"role": "tool", "tool_call_id": "x", "content": "20"}]
    error = assert_openai_error(await api.post("/v1/chat/completions", json={"messages": orphan}), 400, "messages")
    assert "no previous assistant message with a tool call" in error["message"]
    odd_calls: Any = [*ASK, {"role": "assistant", "tool_calls": [{"function": "get_weather"}]}]
    assert_openai_error(await api.post("/v1/chat/completions", json={"messages": odd_calls}), 400, "messages")
    with pytest.raises(openai.BadRequestError):
        await sdk_of(api).chat.completions.create(model="fake", messages=ASK, tools=[WEATHER], tool_choice="required")  # type: ignore[arg-type,list-item]
    anthropic_tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    forced_use = await api.post("/v1/messages", json={"model": "fake", "max_tokens": 50, "messages": ASK,
                                                      "tools": [anthropic_tool], "tool_choice": {"type": "any"}})
    assert forced_use.status_code == 400 and forced_use.json()["error"]["type"] == "invalid_request_error"
