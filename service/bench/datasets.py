"""Benchmark prompts: random token sequences of exact lengths, or request bodies from a JSONL file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from service.model_files.tokenizer import Tokenizer

Endpoint = Literal["completions", "chat"]
_MAX_ADJUSTMENTS = 10
_MAX_RESTARTS = 10


@dataclass(frozen=True)
class SampleRequest:
    """One request to send: its OpenAI body (prompt or messages, max_tokens) and its prompt length."""

    body: dict[str, Any]
    prompt_len: int
    expected_output_len: int | None


def prompt_body(endpoint: Endpoint, prompt: str, max_tokens: int | None) -> dict[str, Any]:
    """The endpoint's body for a plain-text prompt: `prompt`, or one user message."""
    body: dict[str, Any] = {"prompt": prompt} if endpoint == "completions" else {
        "messages": [{"role": "user", "content": prompt}]
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def sample_lengths(rng: np.random.Generator, length: int, range_ratio: float, num: int) -> list[int]:
    """`num` lengths drawn uniformly from [length·(1−r), length·(1+r)], at least 1 each."""
    low, high = int(length * (1 - range_ratio)), int(length * (1 + range_ratio))
    return [max(1, int(n)) for n in rng.integers(low, high + 1, size=num)]


def random_prompt(tokenizer: Tokenizer, rng: np.random.Generator, allowed_ids: np.ndarray, num_tokens: int) -> str:
    """Text of random tokens that encodes back to exactly `num_tokens` tokens.

    As vLLM's random dataset: decode random ids, re-encode (merges change the count), then
    cut the surplus or append more random ids and repeat; a sequence that will not settle
    is drawn anew. Special tokens are never drawn, so the text holds none.
    """
    best = ""
    for _ in range(_MAX_RESTARTS):
        token_ids = rng.choice(allowed_ids, size=num_tokens).tolist()
        for _ in range(_MAX_ADJUSTMENTS):
            text = tokenizer.decode(token_ids)
            token_ids = tokenizer.encode(text)
            if len(token_ids) == num_tokens:
                return text
            if len(token_ids) > num_tokens:
                token_ids = token_ids[:num_tokens]
            else:
                token_ids += rng.choice(allowed_ids, size=num_tokens - len(token_ids)).tolist()
        best = text
    return best


def random_dataset(
    tokenizer: Tokenizer,
    endpoint: Endpoint,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float = 0.0,
    seed: int = 0,
) -> list[SampleRequest]:
    """Prompts of random tokens, `input_len` tokens each as the server counts them (±range_ratio)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    special_ids = set(tokenizer.all_special_ids)
    allowed_ids = np.array([i for i in range(tokenizer.vocab_size) if i not in special_ids])
    # NOTE: BOS (or others) the tokenizer adds count toward the length the server sees.
    num_special = len(tokenizer.encode("", add_special_tokens=True))
    input_lens = sample_lengths(rng, max(1, input_len - num_special), range_ratio, num_prompts)
    output_lens = sample_lengths(rng, output_len, range_ratio, num_prompts)
    samples = []
    for num_tokens, max_tokens in zip(input_lens, output_lens, strict=False):
        text = random_prompt(tokenizer, rng, allowed_ids, num_tokens)
        prompt_len = len(tokenizer.encode(text)) + num_special
        samples.append(SampleRequest(prompt_body(endpoint, text, max_tokens), prompt_len, max_tokens))
    return samples


def jsonl_dataset(tokenizer: Tokenizer, endpoint: Endpoint, path: Path, num_prompts: int) -> list[SampleRequest]:
    """Request bodies, one JSON object a line, repeated in order when the file has fewer than asked."""
    bodies = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            bodies.append(_endpoint_body(json.loads(line), endpoint, f"{path}:{line_number}"))
    if not bodies:
        raise ValueError(f"{path} holds no request bodies")
    samples = []
    for index in range(num_prompts):
        body = bodies[index % len(bodies)]
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        samples.append(SampleRequest(body, count_prompt_tokens(tokenizer, body), max_tokens))
    return samples


def _endpoint_body(body: Any, endpoint: Endpoint, where: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(body).__name__}")
    if endpoint == "chat" and "messages" not in body and isinstance(body.get("prompt"), str):
        rest = {key: value for key, value in body.items() if key != "prompt"}
        return {**rest, "messages": [{"role": "user", "content": body["prompt"]}]}
    key = "prompt" if endpoint == "completions" else "messages"
    if key not in body:
        raise ValueError(f"{where}: a {endpoint} request body needs `{key}`")
    return body


def count_prompt_tokens(tokenizer: Tokenizer, body: dict[str, Any]) -> int:
    """Prompt tokens of a body: the encoded prompt, or the chat rendered by the template."""
    if "messages" in body:
        messages = body["messages"]
        if tokenizer.chat_template is not None:
            return len(tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=True))
        return sum(len(tokenizer.encode(_content_text(m.get("content")))) for m in messages)
    prompt = body["prompt"]
    if isinstance(prompt, list) and all(isinstance(i, int) for i in prompt):
        return len(prompt)
    if isinstance(prompt, list):
        raise ValueError("a batch of prompts in one body is not supported; put one prompt a line")
    return len(tokenizer.encode(str(prompt), add_special_tokens=True))


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")
