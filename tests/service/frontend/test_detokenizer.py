"""Streaming detokenization: deltas add up to the full decode and never split a character."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from service.frontend.detokenizer import IncrementalDetokenizer
from service.model_files.tokenizer import Tokenizer

TEXT = (
    "Streaming 😀 works: 你好，世界! Ünïcödé ok 👩‍👩‍👧 and 🇫🇷.\n"
    "<|im_end|> def f(x):\n\treturn x ** 2  # 日本語\n"
)


@pytest.fixture(scope="module")
def tokenizer(default_model_path: Path) -> Tokenizer:
    return Tokenizer.from_model(default_model_path)


@pytest.mark.real_model
@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_one_token_at_a_time_reproduces_decode(tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
    ids = tokenizer.encode(TEXT)
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)

    deltas = [detokenizer.update([token_id]) for token_id in ids]

    assert "".join(deltas) == tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    assert detokenizer.output_text == "".join(deltas)
    assert not any("\ufffd" in delta for delta in deltas)
    assert "" in deltas  # some emoji/CJK bytes span tokens and wait for the rest


@pytest.mark.real_model
def test_uneven_batches_after_a_prompt(tokenizer: Tokenizer) -> None:
    prompt_ids = tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": "Say 你好"}]))
    ids = tokenizer.encode(TEXT)
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=prompt_ids)
    rng = random.Random(0)

    deltas, start = [], 0
    while start < len(ids):
        size = rng.randint(0, 4)
        deltas.append(detokenizer.update(ids[start : start + size]))
        start += size

    assert "".join(deltas) == tokenizer.decode(ids) == detokenizer.output_text
    assert not any("\ufffd" in delta for delta in deltas)


@pytest.mark.real_model
@pytest.mark.parametrize("num_prompt_ids", range(1, 12))
def test_prompt_cut_inside_a_character_does_not_leak(tokenizer: Tokenizer, num_prompt_ids: int) -> None:
    prompt_ids = tokenizer.encode("abc 🤯🤯🤯 d")[:num_prompt_ids]
    ids = tokenizer.encode("Hi 😀 you")
    detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids=prompt_ids)

    assert "".join(detokenizer.update([token_id]) for token_id in ids) == "Hi 😀 you"
