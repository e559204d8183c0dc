"""What a request body gives the engine (its SamplingParams, checked against the model) and
the fields every response carries (ids, `created`, usage)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from proto.engine_input import SamplingParams
from service.frontend.input_processor import InputProcessor
from service.openai.errors import APIError
from service.openai.protocol import SamplingRequest


def build_sampling_params(
    body: SamplingRequest,
    input_processor: InputProcessor,
    prompt_token_ids: list[int],
    max_tokens: int | None,
    generation_defaults: dict[str, float],
    max_n: int,
) -> SamplingParams:
    """The body's SamplingParams, checked against the model (a 400 naming the bad field)."""
    if body.n > max_n:
        raise APIError(f"'n' must be at most {max_n}, got {body.n}.", param="n")
    vocab_size = input_processor.vocab_size
    if any(not int(k) < vocab_size for k in body.logit_bias or {}):
        raise APIError(f"'logit_bias' keys must be token ids below {vocab_size}.", param="logit_bias")
    if any(not t < vocab_size for t in body.stop_token_ids or []):
        raise APIError(f"'stop_token_ids' must be below {vocab_size}.", param="stop_token_ids")
    if max_tokens is None:
        max_tokens = input_processor.default_max_tokens(prompt_token_ids)
    try:
        return body.to_sampling_params(max_tokens, generation_defaults)
    except ValueError as exc:
        raise APIError(str(exc)) from exc


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }
