"""Request and iteration statistics the gateway derives from engine outputs and their timestamps.

Arrival and end are stamped with the gateway's clock; queueing, scheduling and token times with
the engine's (the `timestamp` of its outputs and its events), so intervals are always taken
between two stamps of the same clock, except TTFT and end-to-end latency, which the client sees.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from proto.engine_output import EngineCoreEventType, EngineCoreOutput


@dataclass
class RequestStateStats:
    """One request's timestamps while it is in flight."""

    arrival_time: float
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    num_generation_tokens: int = 0
    num_preemptions: int = 0
    # NOTE: the request's parameters, as vLLM's histograms count them: n once per prompt (0 on
    # the other samples of an n > 1 fan-out, which are not counted again).
    max_tokens: int = 0
    n: int = 0


@dataclass(frozen=True)
class FinishedRequestStats:
    """One finished request's figures, in seconds and tokens."""

    request_id: str
    finish_reason: str
    e2e_latency: float
    num_prompt_tokens: int
    num_generation_tokens: int
    num_cached_tokens: int
    ttft: float
    queued_time: float
    prefill_time: float
    decode_time: float
    inference_time: float
    num_preemptions: int = 0
    max_tokens: int = 0
    n: int = 0


@dataclass
class IterationStats:
    """What one batch of engine outputs added: tokens, latencies, finished requests."""

    engine_index: int = 0
    timestamp: float = field(default_factory=time.time)
    num_prompt_tokens: int = 0
    num_cached_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    time_to_first_tokens: list[float] = field(default_factory=list)
    inter_token_latencies: list[float] = field(default_factory=list)
    finished_requests: list[FinishedRequestStats] = field(default_factory=list)

    def update_from_output(
        self, output: EngineCoreOutput, engine_timestamp: float, num_prompt_tokens: int, stats: RequestStateStats
    ) -> None:
        for event in output.events or ():
            if event.type == EngineCoreEventType.QUEUED:
                stats.queued_ts = event.timestamp
            elif event.type == EngineCoreEventType.SCHEDULED and not stats.scheduled_ts:
                stats.scheduled_ts = event.timestamp
            elif event.type == EngineCoreEventType.PREEMPTED:
                stats.num_preemptions += 1
        num_new_tokens = len(output.new_token_ids)
        if not num_new_tokens:
            return
        self.num_generation_tokens += num_new_tokens
        if not stats.first_token_ts:
            self.num_prompt_tokens += num_prompt_tokens
            self.num_cached_prompt_tokens += min(output.num_cached_tokens, num_prompt_tokens)
            self.time_to_first_tokens.append(max(0.0, engine_timestamp - stats.arrival_time))
            stats.first_token_ts = engine_timestamp
        else:
            self.inter_token_latencies.append(max(0.0, engine_timestamp - stats.last_token_ts))
        stats.last_token_ts = engine_timestamp
        stats.num_generation_tokens += num_new_tokens

    def update_from_finished_request(
        self,
        request_id: str,
        finish_reason: str,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        stats: RequestStateStats,
    ) -> None:
        now = time.time()
        first, last = stats.first_token_ts, stats.last_token_ts
        scheduled = stats.scheduled_ts or first
        self.finished_requests.append(
            FinishedRequestStats(
                request_id=request_id,
                finish_reason=finish_reason,
                e2e_latency=max(0.0, now - stats.arrival_time),
                num_prompt_tokens=num_prompt_tokens,
                num_generation_tokens=stats.num_generation_tokens,
                num_cached_tokens=num_cached_tokens,
                ttft=max(0.0, first - stats.arrival_time) if first else 0.0,
                queued_time=max(0.0, scheduled - stats.queued_ts) if stats.queued_ts and scheduled else 0.0,
                prefill_time=max(0.0, first - scheduled) if first and scheduled else 0.0,
                decode_time=max(0.0, last - first) if first else 0.0,
                inference_time=max(0.0, last - scheduled) if last and scheduled else 0.0,
                num_preemptions=stats.num_preemptions,
                max_tokens=stats.max_tokens,
                n=stats.n,
            )
        )
