"""Messages an engine pushes to the gateway: per-step deltas and utility results."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# NOTE: a raw frame, never msgpack, so the gateway can test for it before decoding; a second
# frame holds the engine's index (2 bytes, little-endian), a third (msgpack) the ids of the
# requests it was adding or stepping when it failed.
ENGINE_CORE_DEAD = b"ENGINE_CORE_DEAD"


class FinishReason(enum.IntEnum):
    """Why a request finished; `str()` is the OpenAI `finish_reason` value."""

    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self) -> str:
        return self.name.lower()


@dataclass(slots=True)
class Logprobs:
    """Per position: the chosen token first, then the top ones; `ranks` is the chosen token's rank."""

    token_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)

    def extend(self, later: Logprobs) -> None:
        self.token_ids.extend(later.token_ids)
        self.logprobs.extend(later.logprobs)
        self.ranks.extend(later.ranks)


class EngineCoreEventType(enum.IntEnum):
    """A scheduling event of one request, stamped with the engine's clock."""

    QUEUED = 1
    SCHEDULED = 2
    PREEMPTED = 3


@dataclass(slots=True)
class EngineCoreEvent:
    """When something happened to a request in the engine (`time.time()` there)."""

    type: EngineCoreEventType
    timestamp: float


@dataclass(slots=True)
class EngineCoreOutput:
    """The new tokens of one request in one step."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    new_logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None
    # NOTE: the request's scheduling events since its last output; None when there were none.
    events: list[EngineCoreEvent] | None = None
    # NOTE: a pooling request's answer (float32): its embedding, or a pair's scores.
    pooled: np.ndarray | None = None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class UtilityResult:
    """The answer to one `UtilityCall`."""

    call_id: int
    result: Any = None
    error: str | None = None


@dataclass(slots=True)
class SchedulerStats:
    """The engine's state after a step, for the stats log, the metrics, the dashboard and
    `get_stats()`; counters are totals since the engine started, so a lost message loses nothing."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    num_prefix_cache_queries: int = 0
    num_prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # speculative decoding: draft tokens proposed
    num_accepted_tokens: int = 0  # and those the model agreed with
    num_free_blocks: int = 0  # KV cache blocks no request holds

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of queried prompt tokens found in the prefix cache since the engine started."""
        return self.num_prefix_cache_hits / self.num_prefix_cache_queries if self.num_prefix_cache_queries else 0.0


@dataclass(slots=True)
class EngineCoreOutputs:
    """Everything one engine step produced for one client."""

    engine_index: int = 0
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    timestamp: float = 0.0
    utility_output: UtilityResult | None = None
    scheduler_stats: SchedulerStats | None = None
