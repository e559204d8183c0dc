"""PrometheusStatLogger: statistics in, the exposition text Prometheus scrapes out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proto.engine_output import SchedulerStats
from service.observability.metrics import PrometheusStatLogger
from service.observability.stats import FinishedRequestStats, IterationStats


def scrape(stat_logger: PrometheusStatLogger) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample as {(name, labels): value}."""
    text = generate_latest(stat_logger.registry).decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, engine: str = "0",
          **labels: str) -> float:
    return samples[(name, frozenset({"model_name": "tiny", "engine": engine, **labels}.items()))]


def finished(request_id: str, reason: str, e2e: float, queued: float) -> FinishedRequestStats:
    return FinishedRequestStats(
        request_id=request_id, finish_reason=reason, e2e_latency=e2e, num_prompt_tokens=5,
        num_generation_tokens=3, num_cached_tokens=0, ttft=0.1, queued_time=queued,
        prefill_time=0.05, decode_time=0.2, inference_time=0.25,
    )


def test_gauges_follow_the_latest_scheduler_stats() -> None:
    stat_logger = PrometheusStatLogger("tiny")
    stat_logger.record(0, SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5), None)
    stat_logger.record(0, SchedulerStats(num_running_reqs=1, num_waiting_reqs=0, kv_cache_usage=0.25), None)
    samples = scrape(stat_logger)
    assert value(samples, "zeroserve:num_requests_running") == 1
    assert value(samples, "zeroserve:num_requests_waiting") == 0
    assert value(samples, "zeroserve:kv_cache_usage_perc") == 0.25


def test_an_engine_gone_runs_and_holds_nothing_but_keeps_its_counts() -> None:
    stat_logger = PrometheusStatLogger("tiny")
    for engine in (0, 1):
        stat_logger.record(engine, SchedulerStats(num_running_reqs=3, kv_cache_usage=0.5, num_prefix_cache_queries=8), None)
    stat_logger.keep_engines([1])
    samples = scrape(stat_logger)
    assert value(samples, "zeroserve:num_requests_running") == value(samples, "zeroserve:kv_cache_usage_perc") == 0
    assert value(samples, "zeroserve:num_requests_running", engine="1") == 3
    assert value(samples, "zeroserve:prefix_cache_queries_total") == 8


def test_engine_totals_become_counters_by_their_deltas() -> None:
    stat_logger = PrometheusStatLogger("tiny")
    stat_logger.record(0, SchedulerStats(num_prefix_cache_queries=10, num_prefix_cache_hits=4, num_preemptions=1), None)
    stat_logger.record(0, SchedulerStats(num_prefix_cache_queries=30, num_prefix_cache_hits=4, num_preemptions=3,
                                         num_draft_tokens=9, num_accepted_tokens=6), None)
    samples = scrape(stat_logger)
    assert value(samples, "zeroserve:prefix_cache_queries_total") == 30
    assert value(samples, "zeroserve:prefix_cache_hits_total") == 4
    assert value(samples, "zeroserve:num_preemptions_total") == 3
    assert value(samples, "zeroserve:spec_decode_num_draft_tokens_total") == 9
    assert value(samples, "zeroserve:spec_decode_num_accepted_tokens_total") == 6
    # NOTE: a restarted engine's totals start again from zero; none of it is lost.
    stat_logger.record(0, SchedulerStats(num_prefix_cache_queries=5, num_prefix_cache_hits=2), None)
    samples = scrape(stat_logger)
    assert value(samples, "zeroserve:prefix_cache_queries_total") == 35
    assert value(samples, "zeroserve:prefix_cache_hits_total") == 6


def test_iteration_stats_feed_token_counters_finish_reasons_and_histograms() -> None:
    stat_logger = PrometheusStatLogger("tiny")
    stats = IterationStats(
        num_prompt_tokens=12, num_generation_tokens=7, time_to_first_tokens=[0.03, 0.2],
        inter_token_latencies=[0.02, 0.02, 0.3],
        finished_requests=[finished("a", "length", 1.2, 0.0), finished("b", "stop", 0.4, 0.7),
                           finished("c", "length", 3.0, 0.01)],
    )
    stat_logger.record(0, None, stats)
    stat_logger.record(0, None, IterationStats(num_generation_tokens=2))
    samples = scrape(stat_logger)
    assert value(samples, "zeroserve:prompt_tokens_total") == 12
    assert value(samples, "zeroserve:generation_tokens_total") == 9
    assert value(samples, "zeroserve:request_success_total", finished_reason="length") == 2
    assert value(samples, "zeroserve:request_success_total", finished_reason="stop") == 1
    assert value(samples, "zeroserve:time_to_first_token_seconds_count") == 2
    assert value(samples, "zeroserve:time_to_first_token_seconds_bucket", le="0.04") == 1
    assert value(samples, "zeroserve:inter_token_latency_seconds_count") == 3
    assert value(samples, "zeroserve:inter_token_latency_seconds_sum") == pytest.approx(0.34)
    assert value(samples, "zeroserve:e2e_request_latency_seconds_count") == 3
    assert value(samples, "zeroserve:e2e_request_latency_seconds_bucket", le="1.5") == 2
    assert value(samples, "zeroserve:request_queue_time_seconds_count") == 3
    assert value(samples, "zeroserve:request_queue_time_seconds_bucket", le="0.3") == 2


def test_engines_get_their_own_label_and_loggers_their_own_registry() -> None:
    first, second = PrometheusStatLogger("tiny"), PrometheusStatLogger("tiny")
    first.record(0, None, IterationStats(num_prompt_tokens=1))
    first.record(1, None, IterationStats(num_prompt_tokens=5))
    samples = scrape(first)
    assert value(samples, "zeroserve:prompt_tokens_total", engine="0") == 1
    assert value(samples, "zeroserve:prompt_tokens_total", engine="1") == 5
    assert value(scrape(second), "zeroserve:prompt_tokens_total", engine="0") == 0


def test_the_given_engines_series_exist_at_zero_before_any_statistics() -> None:
    samples = scrape(PrometheusStatLogger("tiny", engine_indexes=[0, 1]))
    for engine in ("0", "1"):
        assert value(samples, "zeroserve:num_requests_running", engine=engine) == 0
        assert value(samples, "zeroserve:generation_tokens_total", engine=engine) == 0
        assert value(samples, "zeroserve:e2e_request_latency_seconds_count", engine=engine) == 0
        for reason in ("stop", "length", "abort", "error"):
            assert value(samples, "zeroserve:request_success_total", engine=engine, finished_reason=reason) == 0


# NOTE: prometheus_client picks its multiprocess mode when imported, so each gateway is a process.
GATEWAY_SCRIPT = """
import sys
from prometheus_client import generate_latest
from proto.engine_output import SchedulerStats
from service.observability.metrics import PrometheusStatLogger
from service.observability.stats import IterationStats

index, num_prompt_tokens, num_running = (int(arg) for arg in sys.argv[1:])
stat_logger = PrometheusStatLogger("tiny", api_server_index=index)
stat_logger.record(0, SchedulerStats(num_running_reqs=num_running, num_prefix_cache_queries=10), None)
stat_logger.record(0, SchedulerStats(num_running_reqs=num_running, num_prefix_cache_queries=30), None)
stat_logger.record(0, None, IterationStats(num_prompt_tokens=num_prompt_tokens))
sys.stdout.write(generate_latest(stat_logger.registry).decode())
"""


def run_gateway(metrics_dir: Path, *args: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    result = subprocess.run(
        [sys.executable, "-c", GATEWAY_SCRIPT, *map(str, args)], env=env, capture_output=True, text=True, check=True
    )
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(result.stdout)
        for sample in family.samples
    }


def test_gateway_processes_share_their_values_and_count_engine_totals_once(tmp_path: Path) -> None:
    run_gateway(tmp_path, 0, 5, 3)
    samples = run_gateway(tmp_path, 1, 7, 2)
    assert value(samples, "zeroserve:prompt_tokens_total") == 12
    # NOTE: both saw the engine's total reach 30; only gateway 0 counts it.
    assert value(samples, "zeroserve:prefix_cache_queries_total") == 30
    assert value(samples, "zeroserve:num_requests_running") == 2
    assert value(samples, "zeroserve:request_success_total", finished_reason="stop") == 0


def test_a_gateway_process_without_the_shared_directory_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    with pytest.raises(ValueError):
        PrometheusStatLogger("tiny", api_server_index=0)
