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
from service.observability.stats import IterationStats

NUM_RECENT_REQUESTS = 20

# The /metrics samples a frame reads, by the EngineSample field they fill.
_GAUGES = {
    "zeroserve:num_requests_running": "num_running",
    "zeroserve:num_requests_waiting": "num_waiting",
    "zeroserve:kv_cache_usage_perc": "kv_cache_usage",
}
_COUNTERS = {
    "zeroserve:prompt_tokens_total": "num_prompt_tokens",
    "zeroserve:generation_tokens_total": "num_generation_tokens",
    "zeroserve:prefix_cache_queries_total": "num_prefix_cache_queries",
    "zeroserve:prefix_cache_hits_total": "num_prefix_cache_hits",
    "zeroserve:num_preemptions_total": "num_preemptions",
}
_FINISHED = "zeroserve:request_success_total"


@dataclass
class EngineSample:
    """One engine's series in the registry at one moment (counters are totals so far)."""

    num_running: float = 0.0
    num_waiting: float = 0.0
    kv_cache_usage: float = 0.0
    num_prompt_tokens: float = 0.0
    num_generation_tokens: float = 0.0
    num_prefix_cache_queries: float = 0.0
    num_prefix_cache_hits: float = 0.0
    num_preemptions: float = 0.0
    num_finished: dict[str, float] = field(default_factory=dict)


def read_registry(registry: CollectorRegistry) -> dict[str, EngineSample]:
    """Every engine's sample, by its `engine` label."""
    engines: dict[str, EngineSample] = {}
    for family in registry.collect():
        for sample in family.samples:
            engine = sample.labels.get("engine")
            name = _GAUGES.get(sample.name) or _COUNTERS.get(sample.name)
            if engine is None or (name is None and sample.name != _FINISHED):
                continue
            engine_sample = engines.setdefault(engine, EngineSample())
            if name is not None:
                setattr(engine_sample, name, getattr(engine_sample, name) + sample.value)
            else:
                reason = sample.labels["finished_reason"]
                engine_sample.num_finished[reason] = engine_sample.num_finished.get(reason, 0.0) + sample.value
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
        for engine, sample in sorted(engines.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0):
            before = self.last.get(engine, EngineSample())
            rows.append({
                "engine": engine,
                "num_running": int(sample.num_running),
                "num_waiting": int(sample.num_waiting),
                "kv_cache_usage": sample.kv_cache_usage,
                "prompt_tokens_per_s": _rate(sample.num_prompt_tokens, before.num_prompt_tokens, elapsed),
                "generation_tokens_per_s": _rate(sample.num_generation_tokens, before.num_generation_tokens, elapsed),
                "num_prefix_cache_queries": _delta(sample.num_prefix_cache_queries, before.num_prefix_cache_queries),
                "num_prefix_cache_hits": _delta(sample.num_prefix_cache_hits, before.num_prefix_cache_hits),
            })
        self.last, self.last_time = engines, now
        num_queries = sum(row.pop("num_prefix_cache_queries") for row in rows)
        num_hits = sum(row.pop("num_prefix_cache_hits") for row in rows)
        total_queries = sum(sample.num_prefix_cache_queries for sample in engines.values())
        total_hits = sum(sample.num_prefix_cache_hits for sample in engines.values())
        finished: dict[str, int] = {}
        for sample in engines.values():
            for reason, count in sample.num_finished.items():
                finished[reason] = finished.get(reason, 0) + int(count)
        return {
            "time": time.time(),
            "engines": rows,
            "num_running": sum(row["num_running"] for row in rows),
            "num_waiting": sum(row["num_waiting"] for row in rows),
            "kv_cache_usage": max((row["kv_cache_usage"] for row in rows), default=0.0),
            "prompt_tokens_per_s": sum(row["prompt_tokens_per_s"] for row in rows),
            "generation_tokens_per_s": sum(row["generation_tokens_per_s"] for row in rows),
            # NOTE: over this frame's lookups (None without any), and over all of them.
            "prefix_cache_hit_rate": num_hits / num_queries if num_queries else None,
            "prefix_cache_hit_rate_total": total_hits / total_queries if total_queries else None,
            "num_preemptions": int(sum(sample.num_preemptions for sample in engines.values())),
            "num_finished": finished,
            "recent_requests": list(reversed(self.recent.requests)) if self.recent is not None else [],
        }


def _delta(total: float, before: float) -> float:
    """What a counter added; one that went down was reset (a new registry), so all of it is new."""
    return total - before if total >= before else total


def _rate(total: float, before: float, elapsed: float) -> float:
    return _delta(total, before) / elapsed
