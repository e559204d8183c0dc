"""POST /v1/chat/completions in process, on a fake engine: the response and chunk shapes, SSE
framing, n, usage, logprobs and stop strings (errors: test_errors_inproc.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from service.model_files.tokenizer import Tokenizer
from tests.service.api.fake_engine import MAX_MODEL_LEN, FakeEngineClient

if TYPE_CHECKING:
    from tests.service.conftest import StreamEvents

CHAT = "/v1/chat/completions"
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]


async def chat(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await api.post(CHAT, json={"messages": MESSAGES, "max_tokens": 8, "ignore_eos": True, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def texts_by_choice(chunks: list[dict[str, Any]]) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["delta"].get("content", "")
    return texts


def finals(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [choice for chunk in chunks for choice in chunk["choices"] if choice["finish_reason"] is not None]


async def test_a_whole_response_has_openai_shape(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    body = await chat(api, model="fake-alias", max_tokens=5)
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "prompt_logprobs"}
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "fake-alias" and abs(body["created"] - time.time()) < 60
    assert body["choices"] == [{
        "index": 0,
        "message": {"role": "assistant", "content": engine.output_text(5)},
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,
    }]
    num_prompt_tokens = len(engine.requests[0].prompt_token_ids)
    assert body["usage"] == {"prompt_tokens": num_prompt_tokens, "completion_tokens": 5,
                             "total_tokens": num_prompt_tokens + 5, "prompt_tokens_details": {"cached_tokens": 0}}
    assert body["prompt_logprobs"] is None
    assert (await chat(api, model=None))["model"] == "fake"


@pytest.mark.parametrize("num_tokens_per_step", [1, 3])
async def test_a_stream_is_a_role_chunk_then_deltas_then_usage_then_done(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents, num_tokens_per_step: int
) -> None:
    engine.num_tokens_per_step = num_tokens_per_step
    events = await stream_events(api, CHAT, {"messages": MESSAGES, "max_tokens": 12, "ignore_eos": True,
                                             "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert len({(c["created"], c["model"]) for c in chunks}) == 1 and chunks[0]["model"] == "fake"
    assert chunks[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                     "finish_reason": None, "stop_reason": None}]
    assert [(f["finish_reason"], f["stop_reason"]) for f in finals(chunks)] == [("length", None)]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert texts_by_choice(chunks) == {0: engine.output_text(12)}
    num_prompt_tokens = len(engine.requests[0].prompt_token_ids)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": num_prompt_tokens, "completion_tokens": 12,
                                   "total_tokens": num_prompt_tokens + 12,
                                   "prompt_tokens_details": {"cached_tokens": 0}}
    assert all("usage" not in c for c in chunks[:-1])


async def test_continuous_usage_stats_put_usage_on_every_chunk(
    api: httpx.AsyncClient, stream_events: StreamEvents
) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    events = await stream_events(api, CHAT, {"messages": MESSAGES, "max_tokens": 6, "ignore_eos": True,
                                             "stream_options": options})
    counts = [c["usage"]["completion_tokens"] for c in events[:-1]]
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 6
    assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
               for c in events[:-1])


async def test_n_3_gives_three_indexed_choices_streamed_or_not(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    whole = await chat(api, n=3)
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert [c["message"]["content"] for c in whole["choices"]] == [engine.output_text(8)] * 3
    assert whole["usage"]["completion_tokens"] == 24
    assert len({r.request_id for r in engine.requests}) == 3
    events = await stream_events(api, CHAT, {"messages": MESSAGES, "max_tokens": 8, "ignore_eos": True, "n": 3,
                                             "stream_options": {"include_usage": True}})
    chunks = events[:-1]
    assert [(c["choices"][0]["index"], c["choices"][0]["delta"]) for c in chunks[:3]] == [
        (i, {"role": "assistant", "content": ""}) for i in range(3)
    ]
    assert all(len(c["choices"]) == 1 for c in chunks[:-1])
    assert texts_by_choice(chunks) == {i: engine.output_text(8) for i in range(3)}
    assert sorted((f["index"], f["finish_reason"]) for f in finals(chunks)) == [(i, "length") for i in range(3)]
    assert chunks[-1]["usage"]["completion_tokens"] == 24


async def test_logprobs_with_top_logprobs_streamed_or_not(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer, stream_events: StreamEvents
) -> None:
    completion = await chat(api, logprobs=True, top_logprobs=5)
    assert engine.requests[-1].sampling_params.num_logprobs == 5
    content = completion["choices"][0]["logprobs"]["content"]
    assert len(content) == 8
    for entry, token_id in zip(content, engine.output_ids(8), strict=True):
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["token"] == tokenizer.decode([token_id]) and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 5
        assert all(set(top) == {"token", "logprob", "bytes"} for top in entry["top_logprobs"])
        assert entry["token"] == entry["top_logprobs"][0]["token"]
    events = await stream_events(api, CHAT, {"messages": MESSAGES, "max_tokens": 8, "ignore_eos": True,
                                             "logprobs": True, "top_logprobs": 5})
    streamed = [e for c in events[:-1] if c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    no_top = (await chat(api, logprobs=True))["choices"][0]["logprobs"]["content"]
    assert len(no_top) == 8 and all(entry["top_logprobs"] == [] for entry in no_top)
    assert (await chat(api))["choices"][0]["logprobs"] is None
    assert engine.requests[-1].sampling_params.num_logprobs is None


async def test_prompt_logprobs_cover_every_prompt_token(api: httpx.AsyncClient, stream_events: StreamEvents) -> None:
    completion = await chat(api, max_tokens=1, prompt_logprobs=1)
    positions = completion["prompt_logprobs"]
    assert len(positions) == completion["usage"]["prompt_tokens"] and positions[0] is None
    assert all(1 <= len(p) <= 2 and all(e["logprob"] <= 0 for e in p.values()) for p in positions[1:])
    assert all(set(e) == {"logprob", "rank", "decoded_token"} for p in positions[1:] for e in p.values())
    events = await stream_events(api, CHAT, {"messages": MESSAGES, "max_tokens": 1, "prompt_logprobs": 1})
    assert [c["prompt_logprobs"] for c in events[:-1] if "prompt_logprobs" in c] == [positions]


async def test_a_stop_string_cuts_the_text_streamed_or_not(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    text = engine.output_text(10)
    stop = text[3:6]
    expected = text[: text.index(stop)]
    whole = (await chat(api, max_tokens=10, stop=stop))["choices"][0]
    assert (whole["message"]["content"], whole["finish_reason"], whole["stop_reason"]) == (expected, "stop", stop)
    assert engine.aborted_ids == [engine.requests[0].request_id]  # NOTE: the engine is told to stop too.
    events = await stream_events(api, CHAT, {"messages": MESSAGES, "max_tokens": 10, "stop": stop})
    assert texts_by_choice(events[:-1]) == {0: expected}
    assert [(f["finish_reason"], f["stop_reason"]) for f in finals(events[:-1])] == [("stop", stop)]
    kept = (await chat(api, max_tokens=10, stop=[stop], include_stop_str_in_output=True))["choices"][0]
    assert kept["message"]["content"] == expected + stop


async def test_eos_and_stop_token_ids_end_a_choice_with_stop(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    engine.token_ids = [*engine.token_ids[:3], engine.eos_token_id]
    at_eos = await chat(api, ignore_eos=False)
    assert (at_eos["choices"][0]["finish_reason"], at_eos["choices"][0]["stop_reason"]) == ("stop", None)
    assert at_eos["choices"][0]["message"]["content"] == engine.output_text(3)
    assert at_eos["usage"]["completion_tokens"] == 4
    assert (await chat(api))["choices"][0]["finish_reason"] == "length"
    stop_id = engine.token_ids[1]
    at_stop_id = (await chat(api, stop_token_ids=[stop_id]))["choices"][0]
    assert (at_stop_id["finish_reason"], at_stop_id["stop_reason"]) == ("stop", stop_id)


async def test_roles_tools_and_text_response_format(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    messages = [*MESSAGES, {"role": "tool", "content": "42", "tool_call_id": "call_1"},
                {"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "kind."}]}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    completion = await chat(api, messages=messages, tools=tools, tool_choice="auto", response_format={"type": "text"})
    assert completion["choices"][0]["finish_reason"] == "length"
    assert completion["usage"]["completion_tokens"] == 8
    prompt = tokenizer.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False)
    assert "<|im_start|>tool\n42<|im_end|>" in prompt and "<|im_start|>system\nBe kind.<|im_end|>" in prompt


async def test_continue_final_message_extends_the_assistant_turn(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    messages = [*MESSAGES, {"role": "assistant", "content": "Red and"}]
    rendered = (await api.post("/tokenize", json={"messages": messages, "add_generation_prompt": True})).json()
    completion = await chat(api, messages=messages, max_tokens=1, add_generation_prompt=False,
                            continue_final_message=True)
    assert completion["usage"]["prompt_tokens"] < rendered["count"]  # no end-of-turn, no new assistant header
    assert tokenizer.decode(engine.requests[0].prompt_token_ids, skip_special_tokens=False).endswith("Red and")


async def test_max_tokens_default_to_what_the_context_leaves(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    await chat(api, max_tokens=None, max_completion_tokens=3)
    assert engine.requests[-1].sampling_params.max_tokens == 3
    engine.token_ids = [engine.eos_token_id]
    await chat(api, max_tokens=None, ignore_eos=False)
    num_prompt_tokens = len(engine.requests[-1].prompt_token_ids)
    assert engine.requests[-1].sampling_params.max_tokens == MAX_MODEL_LEN - num_prompt_tokens
