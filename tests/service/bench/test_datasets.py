"""Random prompts of exact token lengths with the real tokenizer; JSONL request bodies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.bench.datasets import jsonl_dataset, random_dataset
from service.model_files.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(default_model_path: Path) -> Tokenizer:
    return Tokenizer.from_model(default_model_path)


@pytest.mark.parametrize("input_len", [1, 7, 32, 230, 1024])
def test_random_prompts_encode_to_exactly_the_asked_length(tokenizer: Tokenizer, input_len: int) -> None:
    samples = random_dataset(tokenizer, "completions", 20, input_len, 8, seed=input_len)
    lengths = [len(tokenizer.encode(s.body["prompt"], add_special_tokens=True)) for s in samples]
    assert lengths == [input_len] * 20
    assert [s.prompt_len for s in samples] == lengths
    assert all(s.body["max_tokens"] == s.expected_output_len == 8 for s in samples)
    assert len({s.body["prompt"] for s in samples}) == 20


def test_range_ratio_spreads_lengths_within_bounds_and_the_seed_repeats_them(tokenizer: Tokenizer) -> None:
    samples = random_dataset(tokenizer, "chat", 30, 100, 20, range_ratio=0.5, seed=5)
    lengths = [len(tokenizer.encode(s.body["messages"][0]["content"])) for s in samples]
    assert lengths == [s.prompt_len for s in samples]
    assert all(50 <= n <= 150 for n in lengths) and len(set(lengths)) > 5
    assert all(10 <= s.expected_output_len <= 30 for s in samples if s.expected_output_len is not None)
    again = random_dataset(tokenizer, "chat", 30, 100, 20, range_ratio=0.5, seed=5)
    assert [s.body for s in again] == [s.body for s in samples]


def test_range_ratio_of_one_or_more_is_refused(tokenizer: Tokenizer) -> None:
    with pytest.raises(ValueError, match="range-ratio"):
        random_dataset(tokenizer, "completions", 1, 10, 10, range_ratio=1.0)


def test_jsonl_bodies_keep_their_fields_and_repeat_to_the_asked_count(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    lines = [{"prompt": "Hello there", "max_tokens": 5, "temperature": 0.5}, {"prompt": [1, 2, 3]}]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    samples = jsonl_dataset(tokenizer, "completions", path, 3)
    assert [s.body for s in samples] == [lines[0], lines[1], lines[0]]
    assert [s.prompt_len for s in samples] == [len(tokenizer.encode("Hello there")), 3, len(tokenizer.encode("Hello there"))]
    assert [s.expected_output_len for s in samples] == [5, None, 5]


def test_jsonl_for_chat_takes_messages_or_wraps_a_prompt(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    messages = [{"role": "user", "content": "Hi"}]
    path.write_text(json.dumps({"messages": messages, "max_tokens": 4}) + "\n" + json.dumps({"prompt": "Yo"}) + "\n")
    first, second = jsonl_dataset(tokenizer, "chat", path, 2)
    assert first.body["messages"] == messages
    assert first.prompt_len == len(tokenizer.encode(tokenizer.apply_chat_template(messages)))
    assert second.body == {"messages": [{"role": "user", "content": "Yo"}]}


def test_jsonl_without_the_endpoints_field_names_the_line(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "x"}) + "\n" + json.dumps({"messages": []}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: a completions request body needs `prompt`"):
        jsonl_dataset(tokenizer, "completions", path, 2)
