"""Messages the gateway sends to an engine (one type byte, then msgpack frames)."""

from __future__ import annotations

import enum
import math
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
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or unset, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if not (self.repetition_penalty > 0.0 and math.isfinite(self.repetition_penalty)):
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        for name in ("num_logprobs", "num_prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0 or unset, got {value}")

    @property
    def is_greedy(self) -> bool:
        # NOTE: dividing logits by a tinier temperature overflows float32; it is greedy anyway.
        return self.temperature < _GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


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
