"""Engine logprobs → OpenAI's shapes (chat's `content` list, completions' parallel lists) and
vLLM's `prompt_logprobs`."""

from __future__ import annotations

from typing import Any

from proto.engine_output import Logprobs
from service.model_files.tokenizer import Tokenizer

# NOTE: JSON has no -inf; OpenAI clients expect a finite floor.
_MIN_LOGPROB = -9999.0


def _token_str(tokenizer: Tokenizer, token_id: int, as_ids: bool = False) -> str:
    """A token's text; with `as_ids` (vLLM's return_tokens_as_token_ids) "token_id:<id>"."""
    if as_ids:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False)


def _finite(logprob: float) -> float:
    return max(logprob, _MIN_LOGPROB)


def _entry(tokenizer: Tokenizer, token_id: int, logprob: float, as_ids: bool = False) -> dict[str, Any]:
    token = _token_str(tokenizer, token_id, as_ids)
    return {"token": token, "logprob": _finite(logprob), "bytes": list(token.encode())}


def _top(tokenizer: Tokenizer, token_ids: list[int], values: list[float], as_ids: bool = False) -> dict[str, float]:
    return {_token_str(tokenizer, t, as_ids): _finite(v) for t, v in zip(token_ids, values, strict=True)}


def chat_logprobs(tokenizer: Tokenizer, logprobs: Logprobs | None, as_ids: bool = False) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    content = []
    for token_ids, values in zip(logprobs.token_ids, logprobs.logprobs, strict=True):
        entry = _entry(tokenizer, token_ids[0], values[0], as_ids)
        entry["top_logprobs"] = [
            _entry(tokenizer, t, v, as_ids) for t, v in zip(token_ids[1:], values[1:], strict=True)
        ]
        content.append(entry)
    return {"content": content}


def completion_logprobs(
    tokenizer: Tokenizer, logprobs: Logprobs, text_offset: int = 0, as_ids: bool = False
) -> dict[str, Any]:
    """Completions' parallel lists; each `top_logprobs` entry holds the sampled token and the top
    ones (with `logprobs: 0`, the sampled token alone), as vLLM and OpenAI give them."""
    tokens, token_logprobs, top_logprobs, text_offsets = [], [], [], []
    for token_ids, values in zip(logprobs.token_ids, logprobs.logprobs, strict=True):
        token = _token_str(tokenizer, token_ids[0], as_ids)
        tokens.append(token)
        token_logprobs.append(_finite(values[0]))
        top_logprobs.append(_top(tokenizer, token_ids, values, as_ids))
        text_offsets.append(text_offset)
        text_offset += len(token)
    return {
        "tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs,
        "text_offset": text_offsets,
    }


def echoed_completion_logprobs(
    tokenizer: Tokenizer, prompt_token_ids: list[int], prompt_logprobs: Logprobs | None, num_top: int,
    as_ids: bool = False,
) -> dict[str, Any]:
    """Completions' logprobs lists for an echoed prompt: the first token has no logprob."""
    tokens = [_token_str(tokenizer, t, as_ids) for t in prompt_token_ids]
    offsets = [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    token_logprobs: list[float | None] = [None]
    top_logprobs: list[dict[str, float] | None] = [None]
    scored = prompt_logprobs or Logprobs()
    for token_ids, values in zip(scored.token_ids, scored.logprobs, strict=True):
        token_logprobs.append(_finite(values[0]))
        top_logprobs.append(_top(tokenizer, token_ids[: 1 + num_top], values[: 1 + num_top], as_ids))
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def join_completion_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    return {key: first[key] + second[key] for key in first}


def prompt_logprobs_list(tokenizer: Tokenizer, logprobs: Logprobs | None) -> list[dict[str, Any] | None] | None:
    """vLLM's `prompt_logprobs`: None for the first prompt token, then {token id: logprob, rank, text}."""
    if logprobs is None:
        return None
    positions: list[dict[str, Any] | None] = [None]
    for token_ids, values, rank in zip(logprobs.token_ids, logprobs.logprobs, logprobs.ranks, strict=True):
        positions.append({
            str(token_id): {
                "logprob": _finite(value),
                "rank": rank if index == 0 else index,
                "decoded_token": _token_str(tokenizer, token_id),
            }
            for index, (token_id, value) in enumerate(zip(token_ids, values, strict=True))
        })
    return positions
