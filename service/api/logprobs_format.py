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
