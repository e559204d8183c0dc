"""/v1/chat/completions through the official OpenAI SDK, on the tiny random model: what the real
engine samples (shapes, SSE framing, stops and errors: test_chat_completions_inproc.py)."""

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


def test_logprobs_with_top_logprobs_streamed_or_not(sdk: openai.OpenAI) -> None:
    completion = chat(sdk, temperature=0, logprobs=True, top_logprobs=5)
    content = completion.choices[0].logprobs.content
    assert len(content) == 8
    for entry in content:
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert entry.logprob == pytest.approx(values[0])  # greedy picks the most likely
        assert entry.token == entry.top_logprobs[0].token
        assert sum(math.exp(v) for v in values) <= 1 + 1e-3
    _, chunks = streamed_texts(sdk, temperature=0, logprobs=True, top_logprobs=5)
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_n_3_with_seed_streamed_matches_non_streamed(sdk: openai.OpenAI) -> None:
    kwargs = {"n": 3, "seed": 5, "temperature": 1.0}
    whole = chat(sdk, **kwargs)
    texts = [c.message.content for c in whole.choices]
    assert len(set(texts)) == 3
    streamed, _ = streamed_texts(sdk, **kwargs)
    assert [streamed[i] for i in range(3)] == texts

