"""Messages the gateway sends to an engine (one type byte, then msgpack frames)."""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_GREEDY_TEMPERATURE = 1e-5


class RequestType(bytes, enum.Enum):
    """First frame of every gateway → engine message."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x02"
    HANDSHAKE = b"\x03"


@dataclass(slots=True)
class SamplingParams:
    """How one request is sampled and when it stops.

    `n` (samples per prompt) and the stop strings are the gateway's: the engine sees one sample
    per request and stops on tokens only.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # NOTE: (token id, bias) pairs, not a dict: msgpack maps keep string keys only.
    logit_bias: list[tuple[int, float]] = field(default_factory=list)
    seed: int | None = None
    max_tokens: int = 16
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    num_logprobs: int | None = None
    num_prompt_logprobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name, is_valid, allowed in SAMPLING_RANGES:
            if not is_valid(self):
                raise ValueError(f"{name} must be {allowed}, got {getattr(self, name)}")

    @property
    def is_greedy(self) -> bool:
        # NOTE: dividing logits by a tinier temperature overflows float32; it is greedy anyway.
        return self.temperature < _GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


def _is_finite_at_least(value: float, low: float, is_open: bool = False) -> bool:
    return math.isfinite(value) and (value > low if is_open else value >= low)


# The values each sampling parameter takes: (name, test on the params, the allowed values in words).
SAMPLING_RANGES: tuple[tuple[str, Callable[[SamplingParams], bool], str], ...] = (
    ("n", lambda p: p.n >= 1, ">= 1"),
    ("temperature", lambda p: _is_finite_at_least(p.temperature, 0.0), "a finite number >= 0"),
    ("top_p", lambda p: 0.0 < p.top_p <= 1.0, "in (0, 1]"),
    ("top_k", lambda p: p.top_k is None or p.top_k >= 1, ">= 1 or unset"),
    ("min_p", lambda p: 0.0 <= p.min_p <= 1.0, "in [0, 1]"),
    ("presence_penalty", lambda p: -2.0 <= p.presence_penalty <= 2.0, "in [-2, 2]"),
    ("frequency_penalty", lambda p: -2.0 <= p.frequency_penalty <= 2.0, "in [-2, 2]"),
    ("repetition_penalty", lambda p: _is_finite_at_least(p.repetition_penalty, 0.0, is_open=True),
     "a finite number > 0"),
    ("max_tokens", lambda p: p.max_tokens >= 1, ">= 1"),
    ("min_tokens", lambda p: 0 <= p.min_tokens <= p.max_tokens, "in [0, max_tokens]"),
    ("num_logprobs", lambda p: p.num_logprobs is None or p.num_logprobs >= 0, ">= 0 or unset"),
    ("num_prompt_logprobs", lambda p: p.num_prompt_logprobs is None or p.num_prompt_logprobs >= 0, ">= 0 or unset"),
)


@dataclass(slots=True)
class EngineCoreRequest:
    """A tokenized request, ready for the scheduler."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    priority: int = 0
    client_index: int = 0
    # NOTE: the gateway's routing choice made by the caller (vLLM's data_parallel_rank).
    data_parallel_rank: int | None = None


@dataclass(slots=True)
class UtilityCall:
    """A named call on the engine core whose result comes back in `EngineCoreOutputs`."""

    call_id: int
    method: str
    args: list[Any] = field(default_factory=list)
    client_index: int = 0
