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


MAX_LOGPROBS = 20
STRUCTURED_OUTPUT_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(slots=True)
class StructuredOutput:
    """What a request's output must match: a JSON schema (`spec`, as JSON text), any JSON object,
    a regex, one of a JSON list of choices, or an EBNF grammar; with `reasoning_end_ids`, only
    what follows the reasoning (which ends with those tokens) must match."""

    kind: str
    spec: str = ""
    # NOTE: a reasoning model's tags as token ids. Without an end, the constraint holds from the
    # first token. With one: `is_reasoning` outputs reason first; others may open reasoning with
    # their first token (a one-token start tag), else the constraint holds from the first token.
    reasoning_start_ids: list[int] = field(default_factory=list)
    reasoning_end_ids: list[int] = field(default_factory=list)
    is_reasoning: bool = False

_INT64 = 2**63


class SamplingParamsError(ValueError):
    """A sampling parameter outside the values it takes (`allowed`, in words)."""

    def __init__(self, name: str, value: Any, allowed: str) -> None:
        super().__init__(f"{name} must be {allowed}, got {value}")
        self.name = name
        self.value = value
        self.allowed = allowed


@dataclass(slots=True)
class SamplingParams:
    """How the engine samples one sequence and when it stops it (on tokens: the gateway handles
    `n` and stop strings, see service/frontend/sampling_params.py)."""

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
    num_logprobs: int | None = None
    num_prompt_logprobs: int | None = None
    structured_output: StructuredOutput | None = None

    def __post_init__(self) -> None:
        check_ranges(self, SAMPLING_RANGES)

    @property
    def is_greedy(self) -> bool:
        # NOTE: dividing logits by a tinier temperature overflows float32; it is greedy anyway.
        return self.temperature < _GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


def _is_finite_at_least(value: float, low: float, is_open: bool = False) -> bool:
    return math.isfinite(value) and (value > low if is_open else value >= low)


def _is_count(value: int | None, high: int | None = None) -> bool:
    return value is None or (value >= 0 and (high is None or value <= high))


# A test on the params, and the values it allows in words, by parameter.
Ranges = tuple[tuple[str, Callable[[Any], bool], str], ...]

# The one declaration of the values each sampling parameter takes: the engine's, LLM's and the
# HTTP routes' (whose 400 names the field from SamplingParamsError.name).
SAMPLING_RANGES: Ranges = (
    ("temperature", lambda p: _is_finite_at_least(p.temperature, 0.0), "a finite number >= 0"),
    ("top_p", lambda p: 0.0 < p.top_p <= 1.0, "in (0, 1]"),
    ("top_k", lambda p: p.top_k is None or p.top_k >= 1, ">= 1, or unset (-1 or 0 in a request)"),
    ("min_p", lambda p: 0.0 <= p.min_p <= 1.0, "in [0, 1]"),
    ("presence_penalty", lambda p: -2.0 <= p.presence_penalty <= 2.0, "in [-2, 2]"),
    ("frequency_penalty", lambda p: -2.0 <= p.frequency_penalty <= 2.0, "in [-2, 2]"),
    ("repetition_penalty", lambda p: _is_finite_at_least(p.repetition_penalty, 0.0, is_open=True),
     "a finite number > 0"),
    ("logit_bias", lambda p: all(-100.0 <= bias <= 100.0 for _, bias in p.logit_bias), "biases in [-100, 100]"),
    ("seed", lambda p: p.seed is None or -_INT64 <= p.seed < _INT64, "a 64-bit signed integer"),
    ("max_tokens", lambda p: p.max_tokens >= 1, ">= 1"),
    ("min_tokens", lambda p: 0 <= p.min_tokens <= p.max_tokens, "in [0, max_tokens]"),
    ("stop_token_ids", lambda p: all(t >= 0 for t in p.stop_token_ids), "token ids >= 0"),
    ("num_logprobs", lambda p: _is_count(p.num_logprobs, MAX_LOGPROBS), f"in [0, {MAX_LOGPROBS}] or unset"),
    ("num_prompt_logprobs", lambda p: _is_count(p.num_prompt_logprobs, MAX_LOGPROBS),
     f"in [0, {MAX_LOGPROBS}] or unset"),
    ("structured_output", lambda p: p.structured_output is None or p.structured_output.kind in STRUCTURED_OUTPUT_KINDS,
     f"one of {STRUCTURED_OUTPUT_KINDS}"),
)


def check_ranges(params: Any, ranges: Ranges) -> None:
    """Raises SamplingParamsError for the first parameter outside its range."""
    for name, is_valid, allowed in ranges:
        if not is_valid(params):
            raise SamplingParamsError(name, getattr(params, name), allowed)


POOLING_TASKS = ("embed", "score")


@dataclass(slots=True)
class PoolingParams:
    """A request for one vector of its text, not tokens: the text's embedding (`embed`, cut to its first
    `dimensions` where asked, then scaled to unit length where the model's vectors are), or a
    cross-encoder's scores of the pair its text holds (`score`)."""

    task: str = "embed"
    dimensions: int | None = None

    def __post_init__(self) -> None:
        if self.task not in POOLING_TASKS:
            raise ValueError(f"pooling task {self.task!r}: expected one of {', '.join(POOLING_TASKS)}")
        if self.dimensions is not None and self.dimensions < 1:
            raise ValueError(f"dimensions must be at least 1, got {self.dimensions}")


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
    # NOTE: a resumed request's output so far, produced by an engine that was lost and already
    # streamed to the client: this engine recomputes their K/V and continues after them.
    resumed_token_ids: list[int] = field(default_factory=list)
    # NOTE: set for a pooling model's request (an embedding or a pair's score), which samples nothing;
    # `token_type_ids` then marks a pair's second text (BERT's segments), one per prompt token.
    pooling_params: PoolingParams | None = None
    token_type_ids: list[int] | None = None


@dataclass(slots=True)
class UtilityCall:
    """A named call on the engine core whose result comes back in `EngineCoreOutputs`."""

    call_id: int
    method: str
    args: list[Any] = field(default_factory=list)
    client_index: int = 0
