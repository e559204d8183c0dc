"""The official OpenAI Python SDK against a real server running the real default model."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import openai
import pytest
from pydantic import BaseModel, Field

from service.model_files.model_registry import DEFAULT_MODEL
from tests.server_process import ServerProcess, running_server

pytestmark = pytest.mark.real_model

# NOTE: a question whose greedy answer wins by a clear margin at every token (transformers fp32:
# at least 0.97 nats); "the capital of France?" opens on a 0.08-nat tie between "The" and "L",
# which bfloat16's rounding settles either way.
QUESTION = [{"role": "user", "content": "What is the capital of Japan?"}]


@pytest.fixture(scope="module")
def server(default_model_path: object) -> Iterator[ServerProcess]:
    with running_server(DEFAULT_MODEL, "--num-threads", "2") as server:
        yield server


@pytest.fixture
def client(server: ServerProcess) -> Iterator[openai.OpenAI]:
    # NOTE: closed after each test: a client left to the garbage collector leaves its sockets open.
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0) as client:
        yield client


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [DEFAULT_MODEL]


def test_chat_non_streamed(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, max_tokens=32)
    assert "Tokyo" in (completion.choices[0].message.content or "")
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 32


def test_chat_streamed(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=QUESTION, max_tokens=32, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Tokyo" in text
    finish_reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish_reasons == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_non_streamed_and_streamed_agree(client: openai.OpenAI) -> None:
    kwargs = {"model": DEFAULT_MODEL, "prompt": "The capital of France is", "max_tokens": 8}
    whole = client.completions.create(**kwargs)  # type: ignore[call-overload]
    assert "Paris" in whole.choices[0].text
    assert whole.usage.completion_tokens == 8
    streamed = "".join(c.choices[0].text for c in client.completions.create(**kwargs, stream=True))
    assert streamed == whole.choices[0].text


# NOTE: bounded strings: the 135M model sometimes closes an object inside a string ("Kyoto,
# Japan}}}") and runs on; JSON allows it, a maxLength ends it.
Short = Annotated[str, Field(max_length=40)]


class Address(BaseModel):
    city: Short
    country: Short


class Person(BaseModel):
    name: Short
    age: int
    role: Literal["student", "worker", "retired"]
    home: Address
    hobbies: list[Short] = Field(max_length=3)
    nickname: Short | None = None


PEOPLE = [
    ("Maria is a 34 year old nurse from Lisbon, Portugal, who loves surfing and reading.", 34),
    ("Tom, 19, studies physics in Boston, USA, and plays chess.", 19),
    ("Akira is 70 and retired in Kyoto, Japan; he enjoys gardening.", 70),
]


@pytest.mark.parametrize(("text", "age"), PEOPLE)
def test_parse_returns_the_pydantic_object_streamed_or_not(client: openai.OpenAI, text: str, age: int) -> None:
    messages = [{"role": "user", "content": f"Extract the person: {text}"}]
    parsed = client.chat.completions.parse(model=DEFAULT_MODEL, messages=messages, response_format=Person, max_tokens=300)
    person = parsed.choices[0].message.parsed
    assert isinstance(person, Person) and parsed.choices[0].finish_reason == "stop"
    # NOTE: what a 135M model writes in the strings is its own; the age it gets right.
    assert person.age == age
    with client.chat.completions.stream(
        model=DEFAULT_MODEL, messages=messages, response_format=Person, max_tokens=300
    ) as stream:
        streamed = stream.get_final_completion().choices[0].message.parsed
    assert isinstance(streamed, Person) and streamed.age == age


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_call_has_arguments_that_follow_the_schema(client: openai.OpenAI, tool_choice: object) -> None:
    messages = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    completion = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=60,  # type: ignore[arg-type]
    )
    (call,) = completion.choices[0].message.tool_calls or []
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert call.function.name == "get_weather" and set(arguments) == {"city", "unit"}  # type: ignore[union-attr]
    assert arguments["unit"] in ("celsius", "fahrenheit") and isinstance(arguments["city"], str)
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice=tool_choice, max_tokens=60,  # type: ignore[arg-type]
        stream=True,
    )
    pieces = [d for chunk in stream for choice in chunk.choices for d in choice.delta.tool_calls or []]
    assert pieces[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == arguments  # type: ignore[union-attr]


def test_responses_create_and_stream_give_the_chat_answer(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, max_tokens=32)
    response = client.responses.create(model=DEFAULT_MODEL, input=QUESTION[0]["content"], max_output_tokens=32)
    assert response.status == "completed" and response.output_text == chat.choices[0].message.content
    assert "Tokyo" in response.output_text
    assert response.usage is not None and response.usage.output_tokens == chat.usage.completion_tokens  # type: ignore[union-attr]
    with client.responses.stream(model=DEFAULT_MODEL, input=QUESTION[0]["content"], max_output_tokens=32) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text == response.output_text


RESPONSES_WEATHER_TOOL = {"type": "function", **WEATHER_TOOL["function"]}  # type: ignore[dict-item]


def test_responses_tool_call_round_trip(client: openai.OpenAI) -> None:
    question = "What is the weather like in Paris today?"
    response = client.responses.create(
        model=DEFAULT_MODEL, input=question, tools=[RESPONSES_WEATHER_TOOL], tool_choice="required",  # type: ignore[list-item]
        max_output_tokens=60,
    )
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather"
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"city", "unit"} and arguments["unit"] in ("celsius", "fahrenheit")
    answer = client.responses.create(
        model=DEFAULT_MODEL, tools=[RESPONSES_WEATHER_TOOL], max_output_tokens=40,  # type: ignore[list-item]
        input=[
            {"role": "user", "content": question},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 degrees."},
        ],
    )
    (message,) = answer.output
    assert message.type == "message" and answer.output_text.strip()


@pytest.mark.parametrize(("text", "age"), PEOPLE[:2])
def test_responses_parse_returns_the_pydantic_object(client: openai.OpenAI, text: str, age: int) -> None:
    parsed = client.responses.parse(
        model=DEFAULT_MODEL, input=f"Extract the person: {text}", text_format=Person, max_output_tokens=300
    )
    person = parsed.output_parsed
    assert isinstance(person, Person) and parsed.status == "completed" and person.age == age


def test_sdk_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, temperature=-0.5)
    assert "temperature" in str(excinfo.value)


def test_the_default_models_file_given_by_path_is_served_as_by_name(
    client: openai.OpenAI, default_model_path: Path, tmp_path: Path
) -> None:
    # NOTE: no temperature: the model's greedy default must follow its file, under another name too.
    by_name = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, max_tokens=12)
    renamed = tmp_path / "my-copy.gguf"
    shutil.copyfile(default_model_path, renamed)
    with running_server(renamed, "--num-threads", "2") as server:
        by_path = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in by_path.models.list()] == [DEFAULT_MODEL]
        answer = by_path.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, max_tokens=12)
    assert answer.choices[0].message.content == by_name.choices[0].message.content
