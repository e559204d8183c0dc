"""POST /v1/completions in process, on a fake engine: the response and chunk shapes, SSE framing,
prompt forms, n per prompt, echo, usage, logprobs and stop strings (errors: test_errors_inproc.py)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from tests.service.api.fake_engine import FakeEngineClient

if TYPE_CHECKING:
    from tests.service.conftest import StreamEvents

COMPLETIONS = "/v1/completions"
PROMPT = "The quick brown fox"


async def complete(api: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await api.post(COMPLETIONS, json={"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def streamed(
    api: httpx.AsyncClient, stream_events: StreamEvents, **body: Any
) -> tuple[dict[int, str], list[dict[str, Any]]]:
    """Per-choice text and the chunks of a streamed completion ([DONE] checked and left out)."""
    events = await stream_events(api, COMPLETIONS, {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, **body})
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = events[:-1]
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return texts, chunks


def finals(chunks: list[dict[str, Any]]) -> list[tuple[int, str, int | str | None]]:
    return [(c["index"], c["finish_reason"], c["stop_reason"])
            for chunk in chunks for c in chunk["choices"] if c["finish_reason"] is not None]


async def test_a_whole_response_has_openai_shape(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    whole = await complete(api, model="fake-alias")
    assert set(whole) == {"id", "object", "created", "model", "choices", "usage"}
    assert whole["id"].startswith("cmpl-") and whole["object"] == "text_completion"
    assert whole["model"] == "fake-alias" and abs(whole["created"] - time.time()) < 60
    assert whole["choices"] == [{"index": 0, "text": engine.output_text(8), "logprobs": None,
                                 "finish_reason": "length", "stop_reason": None, "prompt_logprobs": None}]
    num_prompt_tokens = len(engine.requests[0].prompt_token_ids)
    assert whole["usage"] == {"prompt_tokens": num_prompt_tokens, "completion_tokens": 8,
                              "total_tokens": num_prompt_tokens + 8, "prompt_tokens_details": {"cached_tokens": 0}}


@pytest.mark.parametrize("num_tokens_per_step", [1, 3])
async def test_streamed_text_equals_non_streamed_text(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents, num_tokens_per_step: int
) -> None:
    engine.num_tokens_per_step = num_tokens_per_step
    whole = await complete(api, max_tokens=10)
    texts, chunks = await streamed(api, stream_events, max_tokens=10)
    assert texts == {0: whole["choices"][0]["text"]}
    assert all(c["object"] == "text_completion" and c["model"] == "fake" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    assert all(set(c["choices"][0]) == {"index", "text", "logprobs", "finish_reason", "stop_reason"} for c in chunks)
    assert finals(chunks) == [(0, "length", None)] and chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_include_usage_and_continuous_usage_stats(api: httpx.AsyncClient, stream_events: StreamEvents) -> None:
    _, chunks = await streamed(api, stream_events, stream_options={"include_usage": True})
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 8
    usage = chunks[-1]["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8 and usage["prompt_tokens"] > 0
    assert all("usage" not in c for c in chunks[:-1])
    _, chunks = await streamed(api, stream_events, stream_options={"include_usage": True, "continuous_usage_stats": True})
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 8
    _, chunks = await streamed(api, stream_events)
    assert all("usage" not in c for c in chunks)


async def test_n_3_gives_three_indexed_choices_streamed_or_not(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    first = await complete(api, n=3, seed=1234)
    assert [c["index"] for c in first["choices"]] == [0, 1, 2]
    assert [c["text"] for c in first["choices"]] == [engine.output_text(8)] * 3
    assert first["usage"]["completion_tokens"] == 24
    assert [r.sampling_params.seed for r in engine.requests] == [1234, 1235, 1236]
    texts, chunks = await streamed(api, stream_events, n=3, seed=1234)
    assert texts == {i: engine.output_text(8) for i in range(3)}
    assert sorted(finals(chunks)) == [(i, "length", None) for i in range(3)]


async def test_prompt_forms_n_per_prompt_and_echo(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    ids = (await api.post("/tokenize", json={"prompt": PROMPT})).json()["tokens"]
    by_text = (await complete(api))["choices"][0]["text"]
    assert engine.requests[-1].prompt_token_ids == ids
    assert (await complete(api, prompt=ids))["choices"][0]["text"] == by_text
    assert engine.requests[-1].prompt_token_ids == ids
    many = await complete(api, prompt=[PROMPT, "Another prompt"], n=2, echo=True)
    # NOTE: choice i * n + j is prompt i's sample j.
    assert [(c["index"], c["text"]) for c in many["choices"]] == [
        (0, PROMPT + by_text), (1, PROMPT + by_text), (2, "Another prompt" + by_text), (3, "Another prompt" + by_text)
    ]
    assert many["usage"]["completion_tokens"] == 4 * 8
    assert many["usage"]["prompt_tokens"] == len(ids) + len(engine.requests[-1].prompt_token_ids)  # once per prompt
    assert (await complete(api, prompt=[ids, ids]))["choices"][1]["text"] == by_text
    echoed = await complete(api, echo=True)
    assert echoed["choices"][0]["text"] == PROMPT + by_text
    texts, chunks = await streamed(api, stream_events, echo=True)
    assert texts[0] == PROMPT + by_text and chunks[0]["choices"][0]["text"].startswith(PROMPT)
    texts, _ = await streamed(api, stream_events, prompt=[PROMPT, "Another prompt"], n=2, echo=True)
    assert texts == {0: PROMPT + by_text, 1: PROMPT + by_text, 2: "Another prompt" + by_text,
                     3: "Another prompt" + by_text}


async def test_logprobs_are_parallel_lists_with_text_offsets(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    whole = await complete(api, logprobs=2)
    assert engine.requests[-1].sampling_params.num_logprobs == 2
    logprobs = whole["choices"][0]["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert "".join(logprobs["tokens"]) == whole["choices"][0]["text"] and len(logprobs["tokens"]) == 8
    assert all(v <= 0 for v in logprobs["token_logprobs"])
    assert all(len(top) == 2 and token in top for top, token in zip(logprobs["top_logprobs"], logprobs["tokens"],
                                                                   strict=True))
    assert logprobs["text_offset"] == [len("".join(logprobs["tokens"][:i])) for i in range(8)]
    _, chunks = await streamed(api, stream_events, logprobs=2)
    streamed_logprobs = [c["choices"][0]["logprobs"] for c in chunks]
    for key in logprobs:
        assert [v for lp in streamed_logprobs for v in lp[key]] == logprobs[key]
    # NOTE: as OpenAI and vLLM give it, `logprobs: 0` still lists the sampled token.
    zero = (await complete(api, logprobs=0))["choices"][0]["logprobs"]
    assert len(zero["tokens"]) == 8
    assert zero["top_logprobs"] == [{t: v} for t, v in zip(zero["tokens"], zero["token_logprobs"], strict=True)]


async def test_prompt_logprobs_and_echo_with_logprobs(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    ids = (await api.post("/tokenize", json={"prompt": PROMPT})).json()["tokens"]
    whole = await complete(api, prompt=ids, max_tokens=2, prompt_logprobs=3)
    assert engine.requests[-1].sampling_params.num_prompt_logprobs == 3
    positions = whole["choices"][0]["prompt_logprobs"]
    assert positions[0] is None and len(positions) == len(ids)
    assert all(len(p) >= 3 and str(t) in p for p, t in zip(positions[1:], ids[1:], strict=True))
    echoed = await complete(api, prompt=ids, max_tokens=2, echo=True, logprobs=2)
    assert engine.requests[-1].sampling_params.num_prompt_logprobs == 2
    logprobs = echoed["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == len(ids) + 2 and logprobs["token_logprobs"][0] is None
    assert logprobs["top_logprobs"][0] is None and "".join(logprobs["tokens"]) == echoed["choices"][0]["text"]
    assert logprobs["text_offset"] == [len("".join(logprobs["tokens"][:i])) for i in range(len(ids) + 2)]
    texts, chunks = await streamed(api, stream_events, prompt=ids, max_tokens=2, echo=True, logprobs=2)
    assert texts[0] == echoed["choices"][0]["text"]
    streamed_tokens = [t for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
                       for t in c["choices"][0]["logprobs"]["tokens"]]
    assert streamed_tokens == logprobs["tokens"]
    _, chunks = await streamed(api, stream_events, prompt=ids, max_tokens=2, prompt_logprobs=3)
    assert chunks[0]["choices"][0]["prompt_logprobs"] == positions
    assert all("prompt_logprobs" not in c["choices"][0] for c in chunks[1:])


async def test_stop_string_spanning_tokens_is_cut_streamed_or_not(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    tokens = (await complete(api, max_tokens=12, logprobs=0))["choices"][0]["logprobs"]["tokens"]
    text = "".join(tokens)
    boundary = len("".join(tokens[:4]))
    stop = text[boundary - 2 : boundary + 2]  # two characters either side of a token boundary
    assert len(stop) == 4
    expected = text[: text.index(stop)]
    whole = (await complete(api, max_tokens=12, stop=[stop, "never-seen"]))["choices"][0]
    assert (whole["text"], whole["finish_reason"], whole["stop_reason"]) == (expected, "stop", stop)
    texts, chunks = await streamed(api, stream_events, max_tokens=12, stop=stop)
    assert texts[0] == expected
    assert finals(chunks) == [(0, "stop", stop)]
    kept = await complete(api, max_tokens=12, stop=stop, include_stop_str_in_output=True)
    assert kept["choices"][0]["text"] == expected + stop
    late = (await complete(api, max_tokens=12, stop=stop, min_tokens=12))["choices"][0]
    assert (late["text"], late["finish_reason"]) == (text, "length")


async def test_stop_token_ids_and_eos_end_a_choice_with_stop(api: httpx.AsyncClient, engine: FakeEngineClient) -> None:
    stop_id = engine.token_ids[2]
    first = await complete(api, stop_token_ids=[stop_id])
    assert first["choices"][0]["finish_reason"] == "stop" and first["usage"]["completion_tokens"] == 3
    assert first["choices"][0]["stop_reason"] == stop_id
    assert engine.requests[-1].sampling_params.stop_token_ids == [stop_id]
    engine.token_ids = [engine.eos_token_id]
    at_eos = await complete(api, ignore_eos=False)
    assert (at_eos["choices"][0]["text"], at_eos["usage"]["completion_tokens"]) == ("", 1)
    assert (at_eos["choices"][0]["finish_reason"], at_eos["choices"][0]["stop_reason"]) == ("stop", None)
    ignored = await complete(api, max_tokens=3)
    assert ignored["choices"][0]["finish_reason"] == "length" and ignored["usage"]["completion_tokens"] == 3


async def test_a_stop_string_inside_a_step_of_several_tokens_ends_the_usage_and_logprobs_there(
    api: httpx.AsyncClient, engine: FakeEngineClient, stream_events: StreamEvents
) -> None:
    # NOTE: as a step verifying n-gram drafts returns several tokens at once.
    engine.num_tokens_per_step = 6
    tokens = [engine.tokenizer.decode([t]) for t in engine.output_ids(6)]
    stop = tokens[2].strip()  # completed by the third token of the first step
    whole = await complete(api, max_tokens=12, stop=stop, logprobs=1)
    choice = whole["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"], choice["text"]) == ("stop", stop, "".join(tokens[:2]) + " ")
    assert whole["usage"]["completion_tokens"] == 3
    assert choice["logprobs"]["tokens"] == tokens[:3]
    _, chunks = await streamed(api, stream_events, max_tokens=12, stop=stop, logprobs=1,
                               stream_options={"include_usage": True})
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert [t for chunk in chunks for c in chunk["choices"] if c["logprobs"] for t in c["logprobs"]["tokens"]] == tokens[:3]
