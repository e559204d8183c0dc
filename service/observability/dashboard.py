"""The dashboard's figures: the /metrics registry read into engine load and rates, once a frame,
and the last finished requests' TTFT and speed."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from proto.engine_output import SchedulerStats
from service.observability.metrics import SCHEDULER_COUNTERS, SCHEDULER_GAUGES
from service.observability.stats import IterationStats

NUM_RECENT_REQUESTS = 20

# The /metrics samples a frame reads: the engine's SchedulerStats, by its field names (the families
# metrics.py feeds them to), and what the gateways counted of the engine's requests.
_SCHEDULER_STATS = {
    **{f"zeroserve:{name}": stats_field for stats_field, (name, _) in SCHEDULER_GAUGES.items()},
    **{f"zeroserve:{name}_total": stats_field for stats_field, (name, _) in SCHEDULER_COUNTERS.items()},
}
_PROMPT_TOKENS = "zeroserve:prompt_tokens_total"
_GENERATION_TOKENS = "zeroserve:generation_tokens_total"
_FINISHED = "zeroserve:request_success_total"


@dataclass
class EngineSample:
    """One engine's series in the registry at one moment: its SchedulerStats as last reported, and
    the tokens and finished requests the gateways counted (totals so far)."""

    scheduler_stats: SchedulerStats = field(default_factory=SchedulerStats)
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_finished: dict[str, int] = field(default_factory=dict)


def read_registry(registry: CollectorRegistry) -> dict[str, EngineSample]:
    """Every engine's sample, by its `engine` label."""
    engines: dict[str, EngineSample] = {}
    for family in registry.collect():
        for sample in family.samples:
            engine = sample.labels.get("engine")
            if engine is None:
                continue
            engine_sample = engines.setdefault(engine, EngineSample())
            stats_field = _SCHEDULER_STATS.get(sample.name)
            if stats_field is not None:
                # NOTE: the registry holds floats; every figure but kv_cache_usage is a count.
                value = sample.value if stats_field == "kv_cache_usage" else round(sample.value)
                setattr(engine_sample.scheduler_stats, stats_field, value)
            elif sample.name == _PROMPT_TOKENS:
                engine_sample.num_prompt_tokens = round(sample.value)
            elif sample.name == _GENERATION_TOKENS:
                engine_sample.num_generation_tokens = round(sample.value)
            elif sample.name == _FINISHED:
                reason = sample.labels["finished_reason"]
                engine_sample.num_finished[reason] = engine_sample.num_finished.get(reason, 0) + round(sample.value)
    return engines


class RecentRequests:
    """A stat logger that keeps the last finished requests' figures for the dashboard."""

    def __init__(self, maxlen: int = NUM_RECENT_REQUESTS) -> None:
        self.requests: deque[dict[str, Any]] = deque(maxlen=maxlen)

    def record(
        self, engine_index: int, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        if iteration_stats is None:
            return
        for finished in iteration_stats.finished_requests:
            self.requests.append({
                "request_id": finished.request_id,
                "engine": engine_index,
                "finish_reason": finished.finish_reason,
                "finished_at": time.time(),
                "ttft_s": finished.ttft,
                "e2e_s": finished.e2e_latency,
                "num_prompt_tokens": finished.num_prompt_tokens,
                "num_cached_tokens": finished.num_cached_tokens,
                "num_generation_tokens": finished.num_generation_tokens,
                "tokens_per_s": (finished.num_generation_tokens - 1) / finished.decode_time
                if finished.decode_time > 0 and finished.num_generation_tokens > 1 else None,
            })

    def log(self) -> None:
        """Nothing to do: the dashboard reads the requests."""

    def keep_engines(self, engine_indices: Collection[int]) -> None:
        """Nothing kept per engine."""


class DashboardFeed:
    """Turns successive reads of the registry into dashboard frames: each engine's load, and the
    token rates and prefix-cache hit rate since the previous frame."""

    def __init__(
        self,
        registry: CollectorRegistry,
        recent: RecentRequests | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.registry = registry
        self.recent = recent
        self.clock = clock
        self.last = read_registry(registry)
        self.last_time = clock()

    def frame(self) -> dict[str, Any]:
        now = self.clock()
        elapsed = max(now - self.last_time, 1e-9)
        engines = read_registry(self.registry)
        rows: list[dict[str, Any]] = []
        num_queries = num_hits = 0
        for engine, sample in sorted(engines.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0):
            stats, before = sample.scheduler_stats, self.last.get(engine, EngineSample())
            rows.append({
                "engine": engine,
                "num_running_reqs": stats.num_running_reqs,
                "num_waiting_reqs": stats.num_waiting_reqs,
                "kv_cache_usage": stats.kv_cache_usage,
                "prompt_tokens_per_s": _rate(sample.num_prompt_tokens, before.num_prompt_tokens, elapsed),
                "generation_tokens_per_s": _rate(sample.num_generation_tokens, before.num_generation_tokens, elapsed),
            })
            num_queries += _delta(stats.num_prefix_cache_queries, before.scheduler_stats.num_prefix_cache_queries)
            num_hits += _delta(stats.num_prefix_cache_hits, before.scheduler_stats.num_prefix_cache_hits)
        self.last, self.last_time = engines, now
        total_queries = sum(sample.scheduler_stats.num_prefix_cache_queries for sample in engines.values())
        total_hits = sum(sample.scheduler_stats.num_prefix_cache_hits for sample in engines.values())
        finished: dict[str, int] = {}
        for sample in engines.values():
            for reason, count in sample.num_finished.items():
                finished[reason] = finished.get(reason, 0) + count
        return {
            "time": time.time(),
            "engines": rows,
            "num_running_reqs": sum(row["num_running_reqs"] for row in rows),
            "num_waiting_reqs": sum(row["num_waiting_reqs"] for row in rows),
            "kv_cache_usage": max((row["kv_cache_usage"] for row in rows), default=0.0),
            "prompt_tokens_per_s": sum(row["prompt_tokens_per_s"] for row in rows),
            "generation_tokens_per_s": sum(row["generation_tokens_per_s"] for row in rows),
            # NOTE: over this frame's lookups (None without any), and over all of them.
            "prefix_cache_hit_rate": num_hits / num_queries if num_queries else None,
            "prefix_cache_hit_rate_total": total_hits / total_queries if total_queries else None,
            "num_preemptions": sum(sample.scheduler_stats.num_preemptions for sample in engines.values()),
            "num_finished": finished,
            "recent_requests": list(reversed(self.recent.requests)) if self.recent is not None else [],
        }


def _delta(total: int, before: int) -> int:
    """What a counter added; one that went down was reset (a new registry), so all of it is new."""
    return total - before if total >= before else total


def _rate(total: int, before: int, elapsed: float) -> float:
    return _delta(total, before) / elapsed
