"""/v1/chat/completions through the official OpenAI SDK, on the tiny random model."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest

MESSAGES: list[Any] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another?"},
]


def chat(sdk: openai.OpenAI, **kwargs: Any) -> Any:
    extra_body = {"ignore_eos": True, **kwargs.pop("extra_body", {})}
    return sdk.chat.completions.create(
        model="tiny", **{"messages": MESSAGES, "max_tokens": 8, **kwargs}, extra_body=extra_body
    )


def streamed_texts(sdk: openai.OpenAI, **kwargs: Any) -> tuple[dict[int, str], list[Any]]:
    chunks = list(chat(sdk, stream=True, **kwargs))
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    return texts, chunks


def test_roles_tools_and_text_response_format(sdk: openai.OpenAI) -> None:
    messages = [*MESSAGES, {"role": "tool", "content": "42", "tool_call_id": "call_1"}]
    tools: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    completion = chat(sdk, messages=messages, tools=tools, tool_choice="auto", response_format={"type": "text"})
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.completion_tokens == 8
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        chat(sdk, tools=tools, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="response_format"):
        chat(sdk, response_format={"type": "json_object"})


def test_continue_final_message_extends_the_assistant_turn(sdk: openai.OpenAI) -> None:
    body = {"messages": [*MESSAGES, {"role": "assistant", "content": "Red and"}], "add_generation_prompt": False,
            "continue_final_message": True, "max_tokens": 1}
    rendered = sdk.post("/../tokenize", body={**body, "add_generation_prompt": True}, cast_to=object)
    completion = chat(sdk, messages=body["messages"], temperature=0,
                      extra_body={"add_generation_prompt": False, "continue_final_message": True})
    assert completion.usage.prompt_tokens < rendered["count"]  # no end-of-turn, no new assistant header


def test_logprobs_with_top_logprobs_streamed_or_not(sdk: openai.OpenAI) -> None:
    completion = chat(sdk, temperature=0, logprobs=True, top_logprobs=5)
    content = completion.choices[0].logprobs.content
    assert len(content) == 8
    for entry in content:
        assert len(entry.top_logprobs) == 5
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert entry.logprob == pytest.approx(values[0])  # greedy picks the most likely
        assert entry.token == entry.top_logprobs[0].token
        assert sum(math.exp(v) for v in values) <= 1 + 1e-3
    _, chunks = streamed_texts(sdk, temperature=0, logprobs=True, top_logprobs=5)
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert chat(sdk).choices[0].logprobs is None


def test_n_3_with_seed_streamed_matches_non_streamed(sdk: openai.OpenAI) -> None:
    kwargs = {"n": 3, "seed": 5, "temperature": 1.0}
    whole = chat(sdk, **kwargs)
    texts = [c.message.content for c in whole.choices]
    assert [c.index for c in whole.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert whole.usage.completion_tokens == 24
    streamed, chunks = streamed_texts(sdk, **kwargs, stream_options={"include_usage": True})
    assert [streamed[i] for i in range(3)] == texts
    assert chunks[-1].usage.completion_tokens == 24


def test_stop_string_streamed(sdk: openai.OpenAI) -> None:
    text = chat(sdk, temperature=0, max_tokens=10).choices[0].message.content
    stop = text[3:6]
    expected = text[: text.index(stop)]
    streamed, chunks = streamed_texts(sdk, temperature=0, max_tokens=10, stop=stop)
    assert streamed[0] == expected
    finals = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [(f.finish_reason, f.model_extra["stop_reason"]) for f in finals] == [("stop", stop)]


def test_prompt_logprobs_cover_every_prompt_token(sdk: openai.OpenAI) -> None:
    completion = chat(sdk, max_tokens=1, extra_body={"prompt_logprobs": 1})
    positions = completion.model_extra["prompt_logprobs"]
    assert len(positions) == completion.usage.prompt_tokens and positions[0] is None
    assert all(1 <= len(p) <= 2 and all(e["logprob"] <= 0 for e in p.values()) for p in positions[1:])
