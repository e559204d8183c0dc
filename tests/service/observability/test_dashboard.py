"""The dashboard's frames, read from the same registry /metrics serves: load per engine, rates
between frames, prefix-cache hit rates, finished requests, and the last requests' figures."""

from __future__ import annotations

import re
from pathlib import Path

from proto.engine_output import SchedulerStats
from service.observability.dashboard import DashboardFeed, RecentRequests, read_registry
from service.observability.metrics import PrometheusStatLogger
from service.observability.stats import FinishedRequestStats, IterationStats

PAGE_SCRIPT = Path(__file__).resolve().parents[3] / "service" / "api" / "web" / "static" / "dashboard.js"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def finished(request_id: str, reason: str, num_tokens: int, decode_time: float) -> FinishedRequestStats:
    return FinishedRequestStats(
        request_id=request_id, finish_reason=reason, e2e_latency=decode_time + 0.5, num_prompt_tokens=10,
        num_generation_tokens=num_tokens, num_cached_tokens=4, ttft=0.25, queued_time=0.0, prefill_time=0.25,
        decode_time=decode_time, inference_time=decode_time + 0.25,
    )


def loggers() -> tuple[PrometheusStatLogger, RecentRequests, DashboardFeed, Clock]:
    metrics = PrometheusStatLogger("m", engine_indexes=(0, 1))
    recent = RecentRequests(maxlen=3)
    clock = Clock()
    return metrics, recent, DashboardFeed(metrics.registry, recent, clock), clock


def record(metrics: PrometheusStatLogger, recent: RecentRequests, engine_index: int, scheduler: SchedulerStats,
           iteration: IterationStats) -> None:
    for stat_logger in (metrics, recent):
        stat_logger.record(engine_index, scheduler, iteration)


def test_a_frame_has_each_engines_load_and_the_rates_since_the_last_frame() -> None:
    metrics, recent, feed, clock = loggers()
    first = feed.frame()
    assert first["num_running_reqs"] == 0 and first["prefix_cache_hit_rate"] is None and first["recent_requests"] == []
    assert [row["engine"] for row in first["engines"]] == ["0", "1"]

    record(metrics, recent, 0, SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.25,
                                              num_prefix_cache_queries=100, num_prefix_cache_hits=40),
           IterationStats(num_prompt_tokens=50, num_generation_tokens=20,
                          finished_requests=[finished("a", "stop", 21, 2.0), finished("b", "abort", 1, 0.0)]))
    record(metrics, recent, 1, SchedulerStats(num_running_reqs=5, kv_cache_usage=0.5),
           IterationStats(num_generation_tokens=10))
    clock.now += 2.0
    frame = feed.frame()
    assert (frame["num_running_reqs"], frame["num_waiting_reqs"]) == (8, 2)
    engines = {row["engine"]: row for row in frame["engines"]}
    assert (engines["0"]["num_running_reqs"], engines["0"]["num_waiting_reqs"], engines["1"]["num_running_reqs"]) == (3, 2, 5)
    assert (engines["0"]["generation_tokens_per_s"], engines["1"]["generation_tokens_per_s"]) == (10.0, 5.0)
    assert frame["generation_tokens_per_s"] == 15.0 and frame["prompt_tokens_per_s"] == 25.0
    assert frame["kv_cache_usage"] == 0.5
    assert frame["prefix_cache_hit_rate"] == frame["prefix_cache_hit_rate_total"] == 0.4
    assert frame["num_finished"]["stop"] == 1 and frame["num_finished"]["abort"] == 1
    # NOTE: the newest first; a request of one token has no decode speed.
    assert [r["request_id"] for r in frame["recent_requests"]] == ["b", "a"]
    assert frame["recent_requests"][1]["tokens_per_s"] == 10.0 and frame["recent_requests"][0]["tokens_per_s"] is None

    # Nothing new: no rates, no hit rate for this frame, the totals as they were.
    record(metrics, recent, 0, SchedulerStats(num_running_reqs=1, num_prefix_cache_queries=100,
                                              num_prefix_cache_hits=40), None)
    clock.now += 1.0
    quiet = feed.frame()
    assert quiet["generation_tokens_per_s"] == 0.0 and quiet["prefix_cache_hit_rate"] is None
    assert quiet["prefix_cache_hit_rate_total"] == 0.4 and quiet["num_running_reqs"] == 6
    # NOTE: the registry reads back as the engine's own SchedulerStats, figure for figure.
    assert read_registry(metrics.registry)["0"].scheduler_stats == SchedulerStats(
        num_running_reqs=1, num_prefix_cache_queries=100, num_prefix_cache_hits=40)


def test_an_engine_gone_runs_nothing_and_recent_requests_are_bounded() -> None:
    metrics, recent, feed, clock = loggers()
    record(metrics, recent, 1, SchedulerStats(num_running_reqs=5), IterationStats(
        finished_requests=[finished(f"r{index}", "length", 8, 1.0) for index in range(5)]))
    metrics.keep_engines([0])
    clock.now += 1.0
    frame = feed.frame()
    assert frame["num_running_reqs"] == 0
    assert [r["request_id"] for r in frame["recent_requests"]] == ["r4", "r3", "r2"]
    assert read_registry(metrics.registry)["1"].num_finished["length"] == 5


def test_the_page_reads_only_figures_a_frame_has() -> None:
    metrics, recent, feed, _ = loggers()
    record(metrics, recent, 0, SchedulerStats(num_running_reqs=1), IterationStats(finished_requests=[finished("a", "stop", 3, 1.0)]))
    # NOTE: the route adds the engines' status, and on a multi-model server the model the frame is of.
    frame = {**feed.frame(), "engine_status": "serving", "model": "alpha"}
    script = PAGE_SCRIPT.read_text()

    def keys_read(name: str) -> set[str]:
        return set(re.findall(rf"\b{name}\.(\w+)", script))

    assert keys_read("frame") and keys_read("frame") | keys_read("f") <= set(frame)
    assert keys_read("engine") <= set(frame["engines"][0])
    assert keys_read("request") <= set(frame["recent_requests"][0])
