"""vLLM's request fields, in process on a fake engine: each row conformance.py calls refused gets a
400 naming it (and vLLM's default is accepted), and the implemented ones do what vLLM does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from service.model_files.tokenizer import Tokenizer, _bos_eos_processor
from service.openai.conformance import REFUSED, REQUESTS, RESPONSES, vllm_default
from tests.service.api.fake_engine import MAX_MODEL_LEN, FakeEngineClient

if TYPE_CHECKING:
    from tests.service.conftest import StreamEvents

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# NOTE: where each of conformance.py's request models is sent.
PATHS = {"chat": CHAT, "completions": COMPLETIONS, "tokenize_completion": "/tokenize", "tokenize_chat": "/tokenize",
         "detokenize": "/detokenize", "stream_options": CHAT}
MESSAGES = [{"role": "user", "content": "Name a colour."}]
REFUSED_ROWS = [
    pytest.param(model, name, row, id=f"{model}.{name}")
    for model, (rows, _) in REQUESTS.items() for name, row in rows.items() if row.status == REFUSED
]


async def post(api: httpx.AsyncClient, path: str, **body: Any) -> dict[str, Any]:
    defaults: dict[str, Any] = {"messages": MESSAGES} if path == CHAT else {"prompt": "The quick brown fox"}
    response = await api.post(path, json={**defaults, "max_tokens": 8, "ignore_eos": True, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def events(api: httpx.AsyncClient, stream_events: StreamEvents, path: str, **body: Any) -> list[dict[str, Any]]:
    defaults: dict[str, Any] = {"messages": MESSAGES} if path == CHAT else {"prompt": "The quick brown fox"}
    all_events = await stream_events(api, path, {**defaults, "max_tokens": 8, "ignore_eos": True, **body})
    assert all_events[-1] == "[DONE]"
    return all_events[:-1]


@pytest.mark.parametrize(("model", "name", "row"), REFUSED_ROWS)
async def test_a_refused_field_gets_a_400_naming_it_and_vllms_default_is_served(
    api: httpx.AsyncClient, engine: FakeEngineClient, model: str, name: str, row: Any
) -> None:
    _, body = REQUESTS[model]
    path = PATHS[model]
    response = await api.post(path, json={**body, name: row.example})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == name and f"'{name}'" in error["message"], error
    assert engine.requests == []
    default = vllm_default(model, name)
    if not isinstance(default, dict):
        accepted = await api.post(path, json={**body, name: default})
        assert accepted.status_code == 200, accepted.text


async def test_sampling_fields_reach_the_engine(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    given = {
        "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.05, "presence_penalty": 0.5,
        "frequency_penalty": 0.25, "repetition_penalty": 1.1, "seed": 42, "min_tokens": 3, "max_tokens": 6,
    }
    for path in (CHAT, COMPLETIONS):
        await post(api, path, **given, logit_bias={"7": 2.5}, ignore_eos=False, priority=-3)
        request = engine.requests[-1]
        params = request.sampling_params
        assert {name: getattr(params, name) for name in given} == given
        assert params.logit_bias == [(7, 2.5)] and not params.ignore_eos and request.priority == -3
        await post(api, path, ignore_eos=True)
        assert engine.requests[-1].sampling_params.ignore_eos


async def test_model_names_a_served_model(api: httpx.AsyncClient) -> None:
    assert (await post(api, CHAT, model="fake-alias"))["model"] == "fake-alias"
    assert (await post(api, COMPLETIONS))["model"] == "fake"


async def test_stream_options_need_stream(api: httpx.AsyncClient, stream_events: StreamEvents) -> None:
    for path in (CHAT, COMPLETIONS):
        response = await api.post(path, json={"prompt": "Hi", "messages": MESSAGES, "stream_options": {"include_usage": True}})
        assert response.status_code == 400 and response.json()["error"]["param"] == "stream_options", response.text
        assert "only allowed when 'stream' is enabled" in response.json()["error"]["message"]
        assert (await api.post(path, json={"prompt": "Hi", "messages": MESSAGES, "stream_options": None})).status_code == 200
        chunks = await events(api, stream_events, path, stream_options={"include_usage": True})
        assert chunks[-1]["usage"]["completion_tokens"] == 8


async def test_include_usage_adds_a_last_usage_chunk(api: httpx.AsyncClient, stream_events: StreamEvents) -> None:
    chunks = await events(api, stream_events, CHAT, stream_options={"include_usage": True})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    assert all("usage" not in chunk for chunk in chunks[:-1])
    assert all("usage" not in chunk for chunk in await events(api, stream_events, CHAT))


async def test_continuous_usage_stats_need_include_usage(api: httpx.AsyncClient, stream_events: StreamEvents) -> None:
    for path in (CHAT, COMPLETIONS):
        alone = await events(api, stream_events, path, stream_options={"continuous_usage_stats": True})
        assert all("usage" not in chunk for chunk in alone)
        both = await events(api, stream_events, path, stream_options={"include_usage": True, "continuous_usage_stats": True})
        assert all("usage" in chunk for chunk in both)


async def test_completions_logprobs_0_gives_the_sampled_token(api: httpx.AsyncClient) -> None:
    logprobs = (await post(api, COMPLETIONS, logprobs=0))["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 8
    assert logprobs["top_logprobs"] == [{t: v} for t, v in zip(logprobs["tokens"], logprobs["token_logprobs"], strict=True)]


async def test_skip_special_tokens_false_keeps_them_in_the_text(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    special = tokenizer.backend.token_to_id("<|im_start|>")
    engine.token_ids = [*tokenizer.encode(" Hi"), special, *tokenizer.encode(" there")]
    for path, text in ((CHAT, lambda r: r["choices"][0]["message"]["content"]), (COMPLETIONS, lambda r: r["choices"][0]["text"])):
        assert text(await post(api, path, max_tokens=3)) == " Hi there"
        assert text(await post(api, path, max_tokens=3, skip_special_tokens=False)) == " Hi<|im_start|> there"


async def test_truncate_prompt_tokens_keeps_the_prompts_end(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    prompt = list(range(100, 110))
    whole = await post(api, COMPLETIONS, prompt=prompt, truncate_prompt_tokens=3)
    assert engine.requests[-1].prompt_token_ids == [107, 108, 109] and whole["usage"]["prompt_tokens"] == 3
    await post(api, COMPLETIONS, prompt=prompt, truncate_prompt_tokens=-1)
    assert engine.requests[-1].prompt_token_ids == prompt
    chat = await post(api, CHAT, truncate_prompt_tokens=4)
    assert len(engine.requests[-1].prompt_token_ids) == 4 and chat["usage"]["prompt_tokens"] == 4
    too_many = await api.post(COMPLETIONS, json={"prompt": prompt, "truncate_prompt_tokens": MAX_MODEL_LEN + 1})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "truncate_prompt_tokens"


async def test_truncation_side_right_keeps_the_prompts_start(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    await post(api, COMPLETIONS, prompt=list(range(100, 110)), truncate_prompt_tokens=3, truncation_side="right")
    assert engine.requests[-1].prompt_token_ids == [100, 101, 102]


@pytest.fixture
def bos_tokenizer(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tokenizer]:
    """The fake's tokenizer adding BOS to encoded text (the default model's adds none)."""
    backend = tokenizer.backend
    monkeypatch.setattr(backend, "post_processor", _bos_eos_processor(backend, tokenizer.special_tokens, True, False))
    yield tokenizer


async def test_add_special_tokens_adds_the_bos_token(
    api: httpx.AsyncClient, engine: FakeEngineClient, bos_tokenizer: Tokenizer
) -> None:
    bos = bos_tokenizer.backend.token_to_id(bos_tokenizer.special_tokens["bos_token"])
    await post(api, COMPLETIONS)
    assert engine.requests[-1].prompt_token_ids[0] == bos
    await post(api, COMPLETIONS, add_special_tokens=False)
    assert engine.requests[-1].prompt_token_ids[0] != bos
    await post(api, CHAT)
    chat_ids = engine.requests[-1].prompt_token_ids
    await post(api, CHAT, add_special_tokens=True)
    assert engine.requests[-1].prompt_token_ids == [bos, *chat_ids]


async def test_request_id_names_the_response(api: httpx.AsyncClient, stream_events: StreamEvents) -> None:
    both = await asyncio.gather(post(api, CHAT, request_id="mine"), post(api, CHAT, request_id="mine"))
    assert [r["id"] for r in both] == ["chatcmpl-mine"] * 2
    assert (await post(api, COMPLETIONS, request_id="mine"))["id"] == "cmpl-mine"
    assert {c["id"] for c in await events(api, stream_events, CHAT, request_id="mine")} == {"chatcmpl-mine"}


async def test_a_request_id_that_cannot_travel_in_a_header_is_a_clear_400(api: httpx.AsyncClient) -> None:
    # NOTE: it comes back as the X-Request-Id header; non-ASCII or a line break would break that.
    for request_id in ("caf\u00e9-\U0009e905", "two words", "line\nbreak"):
        for path, body in ((COMPLETIONS, {"prompt": "Hi"}), (CHAT, {"messages": MESSAGES}), ("/v1/responses", {"input": "Hi"})):
            response = await api.post(path, json={**body, "stream": True, "request_id": request_id})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == "request_id" and "X-Request-Id" in error["message"]


async def test_return_tokens_as_token_ids_names_tokens_by_id(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    expected = [f"token_id:{t}" for t in engine.output_ids(8)]
    chat = await post(api, CHAT, logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)
    content = chat["choices"][0]["logprobs"]["content"]
    assert [entry["token"] for entry in content] == expected
    assert all(entry["top_logprobs"][0]["token"].startswith("token_id:") for entry in content)
    completion = await post(api, COMPLETIONS, logprobs=1, return_tokens_as_token_ids=True)
    assert completion["choices"][0]["logprobs"]["tokens"] == expected


async def test_return_token_ids_gives_prompt_and_completion_ids(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    chat = await post(api, CHAT, return_token_ids=True)
    assert chat["prompt_token_ids"] == engine.requests[-1].prompt_token_ids
    assert chat["choices"][0]["token_ids"] == engine.output_ids(8)
    assert "prompt_token_ids" not in await post(api, CHAT)
    chunks = await events(api, stream_events, CHAT, return_token_ids=True)
    assert chunks[0]["prompt_token_ids"] == engine.requests[-1].prompt_token_ids
    assert all("prompt_token_ids" not in chunk for chunk in chunks[1:])
    assert [t for chunk in chunks for choice in chunk["choices"] for t in choice.get("token_ids", [])] == engine.output_ids(8)
    completion = await post(api, COMPLETIONS, return_token_ids=True)
    choice = completion["choices"][0]
    assert choice["prompt_token_ids"] == engine.requests[-1].prompt_token_ids and choice["token_ids"] == engine.output_ids(8)
    chunks = await events(api, stream_events, COMPLETIONS, return_token_ids=True)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == engine.requests[-1].prompt_token_ids
    assert [t for chunk in chunks for t in chunk["choices"][0]["token_ids"]] == engine.output_ids(8)


@pytest.fixture
def echoing_template(tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tokenizer]:
    """A chat template that writes out every message's role and what vLLM passes it besides."""
    template = (
        "{% for m in messages %}[{{ m.role }}: {{ m.content }}]{% endfor %}"
        "{% if documents %}[docs: {{ documents | map(attribute='text') | join(', ') }}]{% endif %}"
        "{% if reasoning_effort %}[effort: {{ reasoning_effort }}, thinking: {{ enable_thinking }}]{% endif %}"
        "{% if colour %}[colour: {{ colour }}]{% endif %}"
    )
    monkeypatch.setattr(tokenizer, "chat_template", template)
    monkeypatch.setattr(tokenizer, "_compiled_template", None)
    yield tokenizer


async def test_reasoning_effort_and_documents_reach_the_chat_template(
    api: httpx.AsyncClient, engine: FakeEngineClient, echoing_template: Tokenizer
) -> None:
    messages = [{"role": "wizard", "content": "Speak."}, {"role": "user", "content": "Hi"}]
    await post(api, CHAT, messages=messages, documents=[{"title": "a", "text": "Tokyo"}], reasoning_effort="low",
               chat_template_kwargs={"colour": "blue"})
    rendered = echoing_template.decode(engine.requests[-1].prompt_token_ids, skip_special_tokens=False)
    assert rendered == "[wizard: Speak.][user: Hi][docs: Tokyo][effort: low, thinking: True][colour: blue]"


async def test_return_prompt_text_gives_the_rendered_prompt(
    api: httpx.AsyncClient, tokenizer: Tokenizer, stream_events: StreamEvents
) -> None:
    rendered = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert (await post(api, CHAT, return_prompt_text=True))["prompt_text"] == rendered
    assert "prompt_text" not in await post(api, CHAT)
    chunks = await events(api, stream_events, CHAT, return_prompt_text=True)
    assert chunks[0]["prompt_text"] == rendered and all("prompt_text" not in c for c in chunks[1:])


async def test_chat_echo_prepends_the_last_assistant_message(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "Once upon"}]
    generated = engine.output_text(8)
    echoed = await post(api, CHAT, messages=messages, echo=True, add_generation_prompt=False, continue_final_message=True)
    assert echoed["choices"][0]["message"]["content"] == "Once upon" + generated
    chunks = await events(api, stream_events, CHAT, messages=messages, echo=True)
    text = "".join(choice["delta"].get("content", "") for chunk in chunks for choice in chunk["choices"])
    assert text == "Once upon" + generated
    # NOTE: the last message is the user's: nothing to go on from, so nothing is echoed.
    assert (await post(api, CHAT, echo=True))["choices"][0]["message"]["content"] == generated


async def test_responses_carry_vllms_fields(api: httpx.AsyncClient, stream_events: StreamEvents) -> None:
    asks: dict[str, Any] = {"return_token_ids": True, "logprobs": True, "prompt_logprobs": 1}
    chat = await post(api, CHAT, **asks, return_prompt_text=True)
    chat_chunks = await events(api, stream_events, CHAT, **asks, return_prompt_text=True,
                               stream_options={"include_usage": True})
    completion = await post(api, COMPLETIONS, **{**asks, "logprobs": 1})
    completion_chunks = await events(api, stream_events, COMPLETIONS, **{**asks, "logprobs": 1},
                                     stream_options={"include_usage": True})
    tokenized = (await api.post("/tokenize", json={"prompt": "Hi", "return_token_strs": True})).json()
    seen: dict[str, list[dict[str, Any]]] = {
        "chat_response": [chat], "chat_response_choice": chat["choices"],
        "chat_chunk": chat_chunks, "chat_chunk_choice": [c for chunk in chat_chunks for c in chunk["choices"]],
        "completions_response": [completion], "completions_response_choice": completion["choices"],
        "completions_chunk": completion_chunks,
        "completions_chunk_choice": [c for chunk in completion_chunks for c in chunk["choices"]],
        "tokenize_response": [tokenized],
        "detokenize_response": [(await api.post("/detokenize", json={"tokens": tokenized["tokens"]})).json()],
        "model_card": (await api.get("/v1/models")).json()["data"],
        "usage": [chat["usage"]],
    }
    for model, rows in RESPONSES.items():
        keys = {key for body in seen[model] for key in body}
        missing = {name for name, row in rows.items() if row.status == "implemented"} - keys
        assert not missing, f"{model} lacks {sorted(missing)}"


async def test_an_echoed_prompt_keeps_its_special_tokens_so_offsets_fit_the_text(
    api: httpx.AsyncClient, tokenizer: Tokenizer
) -> None:
    prompt = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True))
    choice = (await post(api, COMPLETIONS, prompt=prompt, echo=True, logprobs=0, max_tokens=3))["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"].startswith("<|im_start|>system\n") and "<|im_start|>user\nName a colour.<|im_end|>" in choice["text"]
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert all(choice["text"][offset:].startswith(token)
               for offset, token in zip(logprobs["text_offset"], logprobs["tokens"], strict=True))


async def test_structured_outputs_reach_the_engine_and_a_bad_one_is_a_400(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    asks: list[tuple[str, dict[str, Any], tuple[str, str]]] = [
        (CHAT, {"response_format": {"type": "json_object"}}, ("json_object", "")),
        (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}},
         ("json", json.dumps(schema))),
        (COMPLETIONS, {"structured_outputs": {"regex": "[a-c]+"}}, ("regex", "[a-c]+")),
        (COMPLETIONS, {"structured_outputs": {"choice": ["yes", "no"]}}, ("choice", '["yes", "no"]')),
        (CHAT, {"structured_outputs": {"grammar": 'root ::= "x"'}}, ("grammar", 'root ::= "x"')),
        (CHAT, {"structured_outputs": {"json": schema}}, ("json", json.dumps(schema))),
    ]
    for path, body, (kind, spec) in asks:
        await post(api, path, **body)
        constraint = engine.requests[-1].sampling_params.structured_output
        assert constraint is not None and (constraint.kind, constraint.spec) == (kind, spec), body
    await post(api, CHAT, response_format={"type": "text"})
    assert engine.requests[-1].sampling_params.structured_output is None
    num_sent = len(engine.requests)
    bad: list[tuple[dict[str, Any], str, str]] = [
        ({"structured_outputs": {"regex": "[a-"}}, "structured_outputs.regex", "Unclosed"),
        ({"structured_outputs": {"json": {"type": "bogus"}}}, "structured_outputs.json", "bogus"),
        ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs.grammar", "compile"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice", "non-empty"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag", "not supported"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "schema"),
        ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs", "not both"),
    ]
    for body, param, words in bad:
        response = await api.post(CHAT, json={"messages": MESSAGES, **body})
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["param"] == param and words in error["message"], (body, error)
    assert len(engine.requests) == num_sent


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}


async def test_forced_tool_calls_are_generated_under_their_schema_and_returned_as_calls(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer, stream_events: StreamEvents
) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    engine.token_ids = [*tokenizer.encode('{"city": "Tokyo"}'), engine.eos_token_id]
    whole = await post(api, CHAT, tools=[WEATHER, TIME], tool_choice=named, ignore_eos=False)
    constraint = engine.requests[-1].sampling_params.structured_output
    assert constraint is not None and json.loads(constraint.spec) == WEATHER["function"]["parameters"]
    (choice,) = whole["choices"]
    assert choice["message"]["content"] is None and choice["finish_reason"] == "stop"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}
    chunks = await events(api, stream_events, CHAT, tools=[WEATHER, TIME], tool_choice=named, ignore_eos=False)
    pieces = [c["delta"]["tool_calls"][0] for chunk in chunks for c in chunk["choices"] if "tool_calls" in c["delta"]]
    assert pieces[0]["function"]["name"] == "get_weather" and pieces[0]["id"].startswith("call_")
    assert "".join(p["function"]["arguments"] for p in pieces) == '{"city": "Tokyo"}'
    assert not any(c["delta"].get("content") for chunk in chunks for c in chunk["choices"])

    engine.token_ids = [*tokenizer.encode('[{"name": "get_time", "parameters": {}}]'), engine.eos_token_id]
    required = await post(api, CHAT, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
                          ignore_eos=False, max_tokens=50)
    schema = json.loads(engine.requests[-1].sampling_params.structured_output.spec)  # type: ignore[union-attr]
    assert schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    assert required["choices"][0]["finish_reason"] == "tool_calls"
    assert required["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}
    for body, param in (({"tool_choice": "required"}, "tool_choice"),
                        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
                        ({"tools": [{"type": "function"}]}, "tools.0"),
                        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice")):
        response = await api.post(CHAT, json={"messages": MESSAGES, **body})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, (body, response.text)


async def test_the_hermes_parser_splits_calls_from_content_streamed_or_not(
    serve: Any, engine: FakeEngineClient, tokenizer: Tokenizer, stream_events: StreamEvents
) -> None:
    text = 'Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'
    engine.token_ids = [*tokenizer.encode(text), engine.eos_token_id]
    async with serve(tool_call_parser="hermes") as api:
        whole = await post(api, CHAT, tools=[WEATHER], ignore_eos=False, max_tokens=200)
        (choice,) = whole["choices"]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Let me look. "
        assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}
        chunks = await events(api, stream_events, CHAT, tools=[WEATHER], ignore_eos=False, max_tokens=200)
        deltas = [c["delta"] for chunk in chunks for c in chunk["choices"]]
        assert "".join(d.get("content") or "" for d in deltas) == "Let me look. "
        (call,) = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
        assert call["function"] == choice["message"]["tool_calls"][0]["function"] and call["index"] == 0
        assert [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]] == ["tool_calls"]
        plain = await post(api, CHAT, ignore_eos=False, max_tokens=200)
        assert plain["choices"][0]["message"]["content"] == text and "tool_calls" not in plain["choices"][0]["message"]


async def test_a_reasoning_parser_splits_the_thinking_out_streamed_or_not(
    serve: Any, engine: FakeEngineClient, tokenizer: Tokenizer, stream_events: StreamEvents
) -> None:
    text = ('<think>The user wants the weather; I call the tool.</think>'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</tool_call>')
    engine.token_ids = [*tokenizer.encode(text), engine.eos_token_id]
    async with serve(reasoning_parser="qwen3", tool_call_parser="hermes") as api:
        message = (await post(api, CHAT, tools=[WEATHER], ignore_eos=False, max_tokens=200))["choices"][0]["message"]
        assert message["reasoning_content"] == message["reasoning"] == "The user wants the weather; I call the tool."
        assert message["content"] is None and message["tool_calls"][0]["function"]["name"] == "get_weather"
        chunks = await events(api, stream_events, CHAT, tools=[WEATHER], ignore_eos=False, max_tokens=200)
        deltas = [c["delta"] for chunk in chunks for c in chunk["choices"]]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
        assert not any(d.get("content") for d in deltas)
        assert [d["tool_calls"][0]["function"] for d in deltas if "tool_calls" in d] == [message["tool_calls"][0]["function"]]
        hidden = (await post(api, CHAT, tools=[WEATHER], ignore_eos=False, max_tokens=200, include_reasoning=False))
        assert "reasoning_content" not in hidden["choices"][0]["message"]


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
async def test_a_misspelt_field_is_answered_and_named_in_one_log_line_as_vllm_logs_it(
    api: httpx.AsyncClient, engine: FakeEngineClient, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    await post(api, path, temprature=0.5, user="u1", top_k=5)
    assert engine.requests[-1].sampling_params.temperature == 1.0  # NOTE: the misspelt value reached nothing
    ignored = [record.getMessage() for record in caplog.records if "ignored" in record.getMessage()]
    assert ignored == ["The following fields were present in the request but ignored: ['temprature']"]
