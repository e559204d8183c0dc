"""Natural chat prompts for benchmarks: distinct, of about the asked length, sharing few cached blocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.bench.chat_prompts import chat_dataset, chat_prompts, chat_sentences
from service.model_files.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(default_model_path: Path) -> Tokenizer:
    return Tokenizer.from_model(default_model_path)


def chat_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=True)


def test_prompts_are_distinct_natural_text_of_about_the_asked_length(tokenizer: Tokenizer) -> None:
    prompts = chat_prompts(tokenizer, 300, 230, seed=1)
    assert len(set(prompts)) == 300
    lengths = [len(chat_ids(tokenizer, text)) for text in prompts]
    assert all(170 <= n <= 230 for n in lengths) and sum(lengths) / len(lengths) > 200
    assert all(text.isascii() and text.count(" ") > 100 for text in prompts)  # words, not token soup


def test_prompts_share_no_more_than_a_few_prefix_blocks(tokenizer: Tokenizer) -> None:
    ids = [chat_ids(tokenizer, text) for text in chat_prompts(tokenizer, 200, 230, seed=2)]
    # The system prompt and an opening line: at most 4 blocks of 16 tokens in common with any other.
    by_prefix: dict[tuple[int, ...], int] = {}
    for prompt in ids:
        by_prefix[tuple(prompt[: 5 * 16])] = by_prefix.get(tuple(prompt[: 5 * 16]), 0) + 1
    assert max(by_prefix.values()) == 1


def test_the_seed_repeats_the_prompts_and_requests_carry_their_lengths(tokenizer: Tokenizer) -> None:
    assert chat_prompts(tokenizer, 5, 230, seed=3) == chat_prompts(tokenizer, 5, 230, seed=3)
    assert chat_prompts(tokenizer, 5, 230, seed=3) != chat_prompts(tokenizer, 5, 230, seed=4)
    (sample,) = chat_dataset(tokenizer, "chat", 1, 230, 128, seed=3)
    assert sample.body["max_tokens"] == 128 and sample.expected_output_len == 128
    assert sample.prompt_len == len(chat_ids(tokenizer, sample.body["messages"][0]["content"]))


def test_the_prompts_are_made_of_whole_sentences(tokenizer: Tokenizer) -> None:
    sentences = chat_sentences()
    assert len(set(sentences)) == len(sentences) and all(s[-1] in ".?!" for s in sentences)
    for prompt in chat_prompts(tokenizer, 8, 230):
        rest = prompt.replace("Some background: ", "")
        for sentence in sorted(sentences, key=len, reverse=True):
            rest = rest.replace(sentence, "")
        assert rest.strip() == "", rest
