"""Engine logprobs → the two OpenAI shapes (chat's `content` list, completions' parallel lists)."""

from __future__ import annotations

from typing import Any

from proto.engine_output import Logprobs
from service.tokenizer import Tokenizer


def _token_str(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    token = _token_str(tokenizer, token_id)
    return {"token": token, "logprob": max(logprob, -9999.0), "bytes": list(token.encode())}


def chat_logprobs(tokenizer: Tokenizer, logprobs: Logprobs | None) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    content = []
    for token_ids, values in zip(logprobs.token_ids, logprobs.logprobs, strict=True):
        entry = _entry(tokenizer, token_ids[0], values[0])
        entry["top_logprobs"] = [_entry(tokenizer, t, v) for t, v in zip(token_ids[1:], values[1:], strict=True)]
        content.append(entry)
    return {"content": content}


def completion_logprobs(tokenizer: Tokenizer, logprobs: Logprobs | None, text_offset: int = 0) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    tokens, token_logprobs, top_logprobs, text_offsets = [], [], [], []
    for token_ids, values in zip(logprobs.token_ids, logprobs.logprobs, strict=True):
        token = _token_str(tokenizer, token_ids[0])
        tokens.append(token)
        token_logprobs.append(max(values[0], -9999.0))
        top_logprobs.append({_token_str(tokenizer, t): max(v, -9999.0) for t, v in zip(token_ids[1:], values[1:], strict=True)})
        text_offsets.append(text_offset)
        text_offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": text_offsets}


def prompt_logprobs_list(tokenizer: Tokenizer, logprobs: Logprobs | None) -> list[dict[str, Any] | None] | None:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then {token id: logprob, rank, text}."""
    if logprobs is None:
        return None
    positions: list[dict[str, Any] | None] = [None]
    for token_ids, values, rank in zip(logprobs.token_ids, logprobs.logprobs, logprobs.ranks, strict=True):
        entries = {}
        for index, (token_id, value) in enumerate(zip(token_ids, values, strict=True)):
            entries[str(token_id)] = {
                "logprob": max(value, -9999.0),
                "rank": rank if index == 0 else index,
                "decoded_token": _token_str(tokenizer, token_id),
            }
        positions.append(entries)
    return positions


def echoed_completion_logprobs(
    tokenizer: Tokenizer, prompt_token_ids: list[int], prompt_logprobs: Logprobs | None, num_top: int
) -> dict[str, Any]:
    """Completions' logprobs lists for an echoed prompt: the first token has no logprob."""
    tokens = [_token_str(tokenizer, t) for t in prompt_token_ids]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    token_logprobs: list[float | None] = [None]
    top_logprobs: list[dict[str, float] | None] = [None]
    for token_ids, values in zip(prompt_logprobs.token_ids, prompt_logprobs.logprobs, strict=True) if prompt_logprobs else ():
        token_logprobs.append(max(values[0], -9999.0))
        top_logprobs.append(
            {_token_str(tokenizer, t): max(v, -9999.0) for t, v in zip(token_ids[1 : 1 + num_top], values[1 : 1 + num_top], strict=True)}
        )
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def join_completion_logprobs(first: dict[str, Any], second: dict[str, Any] | None) -> dict[str, Any]:
    if second is None:
        return first
    return {key: first[key] + second[key] for key in first}
