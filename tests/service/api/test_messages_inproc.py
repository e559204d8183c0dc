"""POST /v1/messages and /v1/messages/count_tokens in process, on a fake engine, through Anthropic's
Python SDK and raw HTTP: the Message, the event sequence, tools both ways, thinking, stop
sequences, count_tokens, and errors in Anthropic's shape."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from service.api.app import create_app
from service.api.gateway_state import gateway_of
from service.model_files.tokenizer import Tokenizer
from tests.service.api.fake_engine import FakeEngineClient

MESSAGES = "/v1/messages"
WEATHER = {"name": "get_weather", "description": "The weather in a city.", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@contextlib.asynccontextmanager
async def sdk_of(api: httpx.AsyncClient, **options: Any) -> AsyncIterator[anthropic.AsyncAnthropic]:
    """Anthropic's SDK talking to the app in process that `api` serves."""
    app = api._transport.app  # type: ignore[attr-defined]
    # NOTE: the SDK's 2.x releases speak through httpx2, a fork of httpx; the client given must be of the one it imports.
    http: Any = sys.modules.get("httpx2", httpx)
    transport = http.ASGITransport(app=app, raise_app_exceptions=False)
    async with http.AsyncClient(transport=transport, base_url="http://test") as http_client:
        yield anthropic.AsyncAnthropic(base_url="http://test", api_key=options.pop("api_key", "unused"),
                                       http_client=http_client, max_retries=0, **options)


def prompt_text(engine: FakeEngineClient, tokenizer: Tokenizer) -> str:
    return tokenizer.decode(engine.requests[-1].prompt_token_ids, skip_special_tokens=False)


async def test_a_message_is_answered_with_its_text_stop_reason_and_usage(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    async with sdk_of(api) as client:
        message = await client.messages.create(
            model="fake-alias", max_tokens=6, system="You are brief.",
            messages=[{"role": "user", "content": [{"type": "text", "text": "Name a colour."}]}],
        )
        assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
        assert message.model == "fake-alias" and message.stop_reason == "max_tokens"
        (block,) = message.content
        assert block.type == "text" and block.text == engine.output_text(6)
        num_prompt_tokens = len(engine.requests[-1].prompt_token_ids)
        assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) == num_prompt_tokens
        assert message.usage.output_tokens == 6
        prompt = prompt_text(engine, tokenizer)
        assert "<|im_start|>system\nYou are brief.<|im_end|>" in prompt
        assert prompt.endswith("<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n")

        engine.token_ids = [*engine.token_ids[:3], engine.eos_token_id]
        finished = await client.messages.create(model="fake", max_tokens=50,
                                                messages=[{"role": "user", "content": "Name a colour."}])
        assert finished.stop_reason == "end_turn" and finished.stop_sequence is None
        assert finished.content[0].text == engine.output_text(3)  # type: ignore[union-attr]


async def test_sampling_fields_reach_the_engine(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    async with sdk_of(api) as client:
        # NOTE: the SDK's later releases dropped the sampling fields from create()'s signature; the API has them.
        await client.messages.create(model="fake", max_tokens=7, metadata={"user_id": "u1"},
                                     messages=[{"role": "user", "content": "Hi"}],
                                     extra_body={"temperature": 0.5, "top_p": 0.8, "top_k": 20})
    params = engine.requests[-1].sampling_params
    assert (params.max_tokens, params.temperature, params.top_p, params.top_k) == (7, 0.5, 0.8, 20)


async def test_a_stop_sequence_ends_the_message_and_is_named(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    stop = " fox"
    async with sdk_of(api) as client:
        message = await client.messages.create(model="fake", max_tokens=50, stop_sequences=[stop],
                                               messages=[{"role": "user", "content": "Hi"}])
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
        text = message.content[0].text  # type: ignore[union-attr]
        assert stop not in text and engine.output_text(20).startswith(text + stop)
        async with client.messages.stream(model="fake", max_tokens=50, stop_sequences=[stop],
                                          messages=[{"role": "user", "content": "Hi"}]) as stream:
            streamed = await stream.get_final_message()
        assert (streamed.stop_reason, streamed.stop_sequence) == ("stop_sequence", stop)
        assert streamed.content[0].text == text  # type: ignore[union-attr]


async def test_a_stream_is_anthropics_event_sequence_and_adds_up_to_the_whole(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    body: dict[str, Any] = {"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]}
    async with sdk_of(api) as client:
        whole = await client.messages.create(**body)
        async with client.messages.stream(**body) as stream:
            texts = [text async for text in stream.text_stream]
            final = await stream.get_final_message()
    assert "".join(texts) == final.content[0].text == whole.content[0].text == engine.output_text(5)  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    assert final.usage.input_tokens == whole.usage.input_tokens

    # The SSE framing: each event named by its type, as Anthropic's SDK reads it; no [DONE].
    raw = await api.post(MESSAGES, json={"model": "fake", "max_tokens": 3, "stream": True,
                                         "messages": [{"role": "user", "content": "Hi"}]})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    events = []
    for frame in raw.text.split("\n\n")[:-1]:
        _, name, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        events.append(event)
    assert [event["type"] for event in events] == [
        "message_start", "ping", "content_block_start", *["content_block_delta"] * 3, "content_block_stop",
        "message_delta", "message_stop",
    ]
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    assert {event["delta"]["type"] for event in events if event["type"] == "content_block_delta"} == {"text_delta"}
    assert events[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert "[DONE]" not in raw.text


async def test_message_start_counts_the_prompt_as_message_delta_does_cached_part_apart(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.num_cached_tokens = 16
    async with sdk_of(api) as client:
        async with client.messages.stream(model="fake", max_tokens=3,
                                          messages=[{"role": "user", "content": "Hi there"}]) as stream:
            events = [event async for event in stream]
    num_prompt_tokens = len(engine.requests[-1].prompt_token_ids)
    start = next(event for event in events if event.type == "message_start").message.usage  # type: ignore[union-attr]
    delta = next(event for event in events if event.type == "message_delta").usage  # type: ignore[union-attr]
    assert (start.input_tokens, start.cache_read_input_tokens) == (num_prompt_tokens - 16, 16)
    assert (delta.input_tokens, delta.cache_read_input_tokens) == (num_prompt_tokens - 16, 16)


async def test_a_forced_tool_call_round_trip_whole_and_streamed(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    engine.token_ids = [*tokenizer.encode('{"city": "Tokyo"}'), engine.eos_token_id]
    question = {"role": "user", "content": "Weather in Tokyo?"}
    forced: Any = {"type": "tool", "name": "get_weather"}
    async with sdk_of(api) as client:
        message = await client.messages.create(model="fake", max_tokens=50, messages=[question],  # type: ignore[list-item]
                                               tools=[WEATHER], tool_choice=forced)  # type: ignore[list-item]
        constraint = engine.requests[-1].sampling_params.structured_output
        assert constraint is not None and json.loads(constraint.spec) == WEATHER["input_schema"]
        (call,) = message.content
        assert call.type == "tool_use" and call.name == "get_weather" and call.input == {"city": "Tokyo"}
        assert call.id.startswith("toolu_") and message.stop_reason == "tool_use"

        async with client.messages.stream(model="fake", max_tokens=50, messages=[question],  # type: ignore[list-item]
                                          tools=[WEATHER], tool_choice=forced) as stream:  # type: ignore[list-item]
            events = [event async for event in stream]
            final = await stream.get_final_message()
        pieces = [e.delta.partial_json for e in events
                  if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]  # type: ignore[union-attr]
        assert len(pieces) > 1 and json.loads("".join(pieces)) == call.input
        assert final.content[0].input == call.input and final.stop_reason == "tool_use"  # type: ignore[union-attr]

        # The call's result goes back as a tool_result block, and the model answers with text.
        engine.token_ids = [*tokenizer.encode("It is sunny."), engine.eos_token_id]
        follow_up = await client.messages.create(model="fake", max_tokens=50, tools=[WEATHER], messages=[  # type: ignore[list-item]
            question,  # type: ignore[list-item]
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, call.model_dump()]},  # type: ignore[list-item]
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 21 C"}]},
        ])
    assert follow_up.content[0].text == "It is sunny." and follow_up.stop_reason == "end_turn"  # type: ignore[union-attr]
    assert engine.requests[-1].sampling_params.structured_output is None
    prompt = prompt_text(engine, tokenizer)
    assert "<|im_start|>assistant\nLet me look.<|im_end|>" in prompt and "<|im_start|>tool\nsunny, 21 C" in prompt


async def test_any_tool_choice_forces_a_call_and_none_leaves_the_tools_out(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    engine.token_ids = [*tokenizer.encode('[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'),
                        engine.eos_token_id]
    async with sdk_of(api) as client:
        message = await client.messages.create(model="fake", max_tokens=80, tools=[WEATHER],  # type: ignore[list-item]
                                               tool_choice={"type": "any"}, messages=[{"role": "user", "content": "?"}])
        assert [(b.type, b.input) for b in message.content] == [("tool_use", {"city": "Oslo"})]  # type: ignore[union-attr]
        assert message.stop_reason == "tool_use"
        engine.token_ids = [*tokenizer.encode("No tools."), engine.eos_token_id]
        plain = await client.messages.create(model="fake", max_tokens=80, tools=[WEATHER],  # type: ignore[list-item]
                                             tool_choice={"type": "none"}, messages=[{"role": "user", "content": "?"}])
    assert plain.content[0].text == "No tools." and "get_weather" not in prompt_text(engine, tokenizer)  # type: ignore[union-attr]


async def test_thinking_comes_out_as_thinking_blocks(serve: Any, engine: FakeEngineClient, tokenizer: Tokenizer) -> None:
    text = "<think>The user wants a colour.</think>Blue."
    engine.token_ids = [*tokenizer.encode(text), engine.eos_token_id]
    body: dict[str, Any] = {"model": "fake", "max_tokens": 50, "messages": [{"role": "user", "content": "Colour?"}],
                            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    async with serve(reasoning_parser="qwen3") as api, sdk_of(api) as client:
        whole = await client.messages.create(**body)
        assert [block.type for block in whole.content] == ["thinking", "text"]
        assert whole.content[0].thinking == "The user wants a colour."  # type: ignore[union-attr]
        assert whole.content[1].text == "Blue."  # type: ignore[union-attr]
        async with client.messages.stream(**body) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_message()
        kinds = {e.delta.type for e in events if e.type == "content_block_delta"}  # type: ignore[union-attr]
        assert kinds == {"thinking_delta", "text_delta"}
        assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
        disabled = await client.messages.create(**{**body, "thinking": {"type": "disabled"}})
        assert [block.type for block in disabled.content] == ["text"]


async def test_count_tokens_is_the_prompt_the_message_is_charged(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    body: dict[str, Any] = {"model": "fake", "system": [{"type": "text", "text": "Be brief."}], "tools": [WEATHER],
                            "messages": [{"role": "user", "content": "Weather in Oslo?"}]}
    async with sdk_of(api) as client:
        counted = await client.messages.count_tokens(**body)
        message = await client.messages.create(max_tokens=3, **body)
    assert counted.input_tokens == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
    assert counted.input_tokens == len(engine.requests[-1].prompt_token_ids)
    assert len(engine.requests) == 1  # count_tokens sends nothing to the engine


async def test_errors_are_anthropics_shape_and_name_the_field(api: httpx.AsyncClient) -> None:
    hi = [{"role": "user", "content": "Hi"}]
    cases: list[tuple[dict[str, Any], int, str, str]] = [
        ({"model": "fake", "messages": hi}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "fake", "max_tokens": 0, "messages": hi}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "nope", "max_tokens": 5, "messages": hi}, 404, "not_found_error", "nope"),
        ({"model": "fake", "max_tokens": 5, "messages": hi, "container": "c1"}, 400, "invalid_request_error",
         "container"),
        ({"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}, 400,
         "invalid_request_error", "messages.0.content.0"),
        ({"model": "fake", "max_tokens": 5, "messages": hi, "tools": [{"type": "web_search_20250305",
                                                                        "name": "web_search"}]}, 400,
         "invalid_request_error", "tools.0"),
        ({"model": "fake", "max_tokens": 5, "messages": hi, "tools": [WEATHER],
          "tool_choice": {"type": "tool", "name": "other"}}, 400, "invalid_request_error", "tool_choice.name"),
        ({"model": "fake", "max_tokens": 5, "messages": hi, "temperature": -1}, 400, "invalid_request_error",
         "temperature"),
        ({"model": "fake", "max_tokens": 5, "messages": hi, "output_config": {"format": {
            "type": "json_schema", "schema": {"type": "no-such-type"}}}}, 400, "invalid_request_error", "output_config"),
        ({"model": "fake", "max_tokens": 10**6, "messages": hi}, 400, "invalid_request_error", "maximum context length"),
    ]
    for body, status, error_type, named in cases:
        response = await api.post(MESSAGES, json=body, headers={"anthropic-version": "2023-06-01"})
        assert response.status_code == status, (body, response.text)
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == error_type, error
        assert named in error["error"]["message"], (named, error)
    not_json = await api.post(MESSAGES, content=b"{", headers={"content-type": "application/json"})
    assert not_json.status_code == 400 and not_json.json()["error"]["type"] == "invalid_request_error"
    wrong_method = await api.get("/v1/messages/count_tokens")
    assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
    # The OpenAI routes keep OpenAI's shape.
    openai_error = await api.post("/v1/chat/completions", json={"model": "nope", "messages": hi})
    assert openai_error.json()["error"]["code"] == "model_not_found" and "type" not in openai_error.json()

    async with sdk_of(api) as client:
        with pytest.raises(anthropic.BadRequestError) as caught:
            await client.messages.create(model="fake", max_tokens=5, messages=hi, extra_body={"temperature": -1})  # type: ignore[arg-type]
        assert caught.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="nope", max_tokens=5, messages=hi)  # type: ignore[arg-type]


async def test_a_field_anthropic_does_not_document_is_refused_by_name_and_ignored_ones_are_logged(
    api: httpx.AsyncClient, engine: FakeEngineClient, caplog: pytest.LogCaptureFixture
) -> None:
    hi = [{"role": "user", "content": "Hi"}]
    for path, body in [(MESSAGES, {"model": "fake", "max_tokens": 5, "messages": hi, "temprature": 0.5}),
                       (f"{MESSAGES}/count_tokens", {"model": "fake", "messages": hi, "max_tokens": 5})]:
        response = await api.post(path, json=body)
        assert response.status_code == 400, response.text
        misspelt = "temprature" if path == MESSAGES else "max_tokens"
        assert response.json() == {"type": "error", "error": {
            "type": "invalid_request_error", "message": f"{misspelt}: Extra inputs are not permitted"}}
    assert engine.requests == []
    async with sdk_of(api) as client:
        # NOTE: what Anthropic documents and a local server has no use for is answered, and named in the log.
        message = await client.messages.create(
            model="fake", max_tokens=2, messages=hi, metadata={"user_id": "u1"},  # type: ignore[arg-type]
            service_tier="auto", extra_body={"top_k": 20, "cache_control": {"type": "ephemeral"}, "speed": "standard"},
        )
        assert message.usage.output_tokens == 2
        counted = await client.messages.count_tokens(model="fake", messages=hi,  # type: ignore[arg-type]
                                                     extra_body={"cache_control": {"type": "ephemeral"}})
        assert counted.input_tokens > 0
    ignored = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    assert ignored == ["The following fields were present in the request but ignored: "
                       "['cache_control', 'service_tier', 'speed']",
                       "The following fields were present in the request but ignored: ['cache_control']"]


async def test_a_server_not_ready_answers_anthropics_529_overloaded() -> None:
    hi = [{"role": "user", "content": "Hi"}]
    transport = httpx.ASGITransport(create_app(None))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as loading:
        response = await loading.post(MESSAGES, json={"model": "fake", "max_tokens": 2, "messages": hi})
        assert response.status_code == 529
        assert response.json()["error"]["type"] == "overloaded_error"
        async with sdk_of(loading) as client:
            with pytest.raises(anthropic.APIStatusError) as caught:
                await client.messages.create(model="fake", max_tokens=2, messages=hi)  # type: ignore[arg-type]
    assert caught.value.status_code == 529
    assert caught.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]


async def test_a_stream_whose_engine_dies_ends_with_an_error_event(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    engine.die_after(2)
    async with sdk_of(api) as client:
        with pytest.raises(anthropic.APIStatusError) as caught:
            async with client.messages.stream(model="fake", max_tokens=50,
                                              messages=[{"role": "user", "content": "Hi"}]) as stream:
                async for _ in stream:
                    pass
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    assert caught.value.body["error"]["type"] in ("api_error", "overloaded_error")  # type: ignore[index]


async def test_the_api_key_is_taken_from_x_api_key_or_the_bearer_token(serve: Any) -> None:
    hi = [{"role": "user", "content": "Hi"}]
    async with serve(api_keys=("secret",)) as api:
        async with sdk_of(api, api_key="secret") as client:
            message = await client.messages.create(model="fake", max_tokens=2, messages=hi)  # type: ignore[arg-type]
            assert message.usage.output_tokens == 2
        async with sdk_of(api, api_key="wrong") as client:
            with pytest.raises(anthropic.AuthenticationError) as caught:
                await client.messages.create(model="fake", max_tokens=2, messages=hi)  # type: ignore[arg-type]
            assert caught.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        bearer = await api.post(MESSAGES, json={"model": "fake", "max_tokens": 2, "messages": hi},
                                headers={"authorization": "Bearer secret"})
        assert bearer.status_code == 200
        # The OpenAI routes take Anthropic's header too.
        chat = await api.post("/v1/chat/completions", json={"model": "fake", "max_tokens": 2, "messages": hi},
                              headers={"x-api-key": "secret"})
        assert chat.status_code == 200
        refused = await api.post("/v1/chat/completions", json={"model": "fake", "messages": hi})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


async def test_a_kept_stream_holds_and_gives_back_one_admission_slot(serve: Any) -> None:
    body = {"model": "fake", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    async with serve(stream_retention_s=30.0) as api:
        admission = gateway_of(api._transport.app).admission  # type: ignore[attr-defined]
        response = await api.post(MESSAGES, json=body, headers={"x-request-id": "m-1"})
        assert response.status_code == 200 and "event: message_stop" in response.text
        resumed = await api.post(MESSAGES, json=body, headers={"x-request-id": "m-1"})
        assert resumed.text == response.text
        assert admission.num_in_flight == 0


async def test_a_body_over_the_limit_is_anthropics_413(serve: Any) -> None:
    async with serve(max_request_body_bytes=1024) as api:
        response = await api.post(MESSAGES, json={"model": "fake", "max_tokens": 3,
                                                  "messages": [{"role": "user", "content": "x" * 2000}]})
    assert response.status_code == 413
    assert response.json() == {"type": "error", "error": {"type": "request_too_large", "message": response.json()[
        "error"]["message"]}} and "1024 bytes" in response.json()["error"]["message"]


async def test_a_last_assistant_turn_is_a_prefill_the_answer_goes_on_from(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    async with sdk_of(api) as client:
        message = await client.messages.create(model="fake", max_tokens=3, messages=[
            {"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "My answer:"}])
    assert prompt_text(engine, tokenizer).endswith("<|im_start|>assistant\nMy answer:")
    assert message.content[0].text == engine.output_text(3)  # type: ignore[union-attr]


async def test_a_system_turn_among_the_messages_is_an_instruction_where_it_stands(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    # NOTE: Claude Code sends these beside the top-level system.
    response = await api.post(MESSAGES, json={"model": "fake", "max_tokens": 2, "system": "Be brief.", "messages": [
        {"role": "user", "content": "Hi"}, {"role": "system", "content": [{"type": "text", "text": "Be kind."}]},
        {"role": "user", "content": "Bye"}]})
    assert response.status_code == 200, response.text
    assert ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\nBe kind."
            "<|im_end|>\n<|im_start|>user\nBye<|im_end|>") in prompt_text(engine, tokenizer)


async def test_a_call_the_model_chose_is_a_tool_use_block_with_a_tool_call_parser(
    serve: Any, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    text = 'Let me look. <tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    engine.token_ids = [*tokenizer.encode(text), engine.eos_token_id]
    body: Any = {"model": "fake", "max_tokens": 80, "tools": [WEATHER], "messages": [{"role": "user", "content": "?"}]}
    async with serve(tool_call_parser="hermes") as api, sdk_of(api) as client:
        whole = await client.messages.create(**body)
        async with client.messages.stream(**body) as stream:
            final = await stream.get_final_message()
    for message in (whole, final):
        assert [block.type for block in message.content] == ["text", "tool_use"]
        assert message.content[0].text == "Let me look. "  # type: ignore[union-attr]
        assert message.content[1].input == {"city": "Oslo"} and message.stop_reason == "tool_use"  # type: ignore[union-attr]
