"""Messages the gateway sends to an engine (one type byte, then msgpack frames)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any


class RequestType(bytes, enum.Enum):
    """First frame of every gateway → engine message."""

    ADD = b"\x00"
    ABORT = b"\x01"
    UTILITY = b"\x02"


@dataclass(slots=True)
class SamplingParams:
    """How one request is sampled and when it stops (engine-side fields only)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    max_tokens: int = 16
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or unset, got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@dataclass(slots=True)
class EngineCoreRequest:
    """A tokenized request, ready for the scheduler."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = 0.0
    priority: int = 0
    client_index: int = 0


@dataclass(slots=True)
class UtilityCall:
    """A named call on the engine core whose result comes back in `EngineCoreOutputs`."""

    call_id: int
    method: str
    args: list[Any] = field(default_factory=list)
    client_index: int = 0
