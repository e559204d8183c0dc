"""The periodic stats line: figures over the interval, silent when idle."""

from __future__ import annotations

import logging

import pytest

from proto.engine_output import SchedulerStats
from service.observability.stat_loggers import LoggingStatLogger
from service.observability.stats import IterationStats


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "zeroserve.stats"]


def test_line_reports_the_interval(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("service.observability.stat_loggers.time.monotonic", lambda: clock[0])
    stat_logger = LoggingStatLogger(interval_s=10.0)
    stat_logger.record(0, SchedulerStats(2, 1, 0.25, 100, 40, 3), IterationStats(num_prompt_tokens=300))
    stat_logger.record(0, SchedulerStats(2, 1, 0.25, 200, 90, 4), IterationStats(num_generation_tokens=50))
    clock[0] = 105.0
    with caplog.at_level(logging.INFO, logger="zeroserve.stats"):
        stat_logger.maybe_log()
        assert lines(caplog) == []
        clock[0] = 110.0
        stat_logger.maybe_log()
    assert lines(caplog) == [
        "Engine 000: Avg prompt throughput: 30.0 tokens/s, Avg generation throughput: 5.0 tokens/s, "
        "Running: 2 reqs, Waiting: 1 reqs, KV cache usage: 25.0%, Prefix cache hit rate: 45.0%, "
        "Preemptions: 4"
    ]


def test_next_line_counts_only_what_came_after(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0.0]
    monkeypatch.setattr("service.observability.stat_loggers.time.monotonic", lambda: clock[0])
    stat_logger = LoggingStatLogger(interval_s=1.0)
    stat_logger.record(1, SchedulerStats(1, 0, 0.5, 100, 50, 2), IterationStats(num_generation_tokens=10))
    clock[0] = 1.0
    stat_logger.log()
    stat_logger.record(1, SchedulerStats(1, 0, 0.5, 300, 50, 2), IterationStats(num_generation_tokens=4))
    clock[0] = 3.0
    with caplog.at_level(logging.INFO, logger="zeroserve.stats"):
        stat_logger.log()
    [line] = lines(caplog)
    assert line.startswith("Engine 001: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 2.0 tokens/s")
    assert line.endswith("Prefix cache hit rate: 0.0%, Preemptions: 0")


def test_line_reports_the_draft_acceptance_rate_of_the_interval(caplog: pytest.LogCaptureFixture) -> None:
    stat_logger = LoggingStatLogger(interval_s=1.0)
    stat_logger.record(0, SchedulerStats(1, 0, 0.5, num_draft_tokens=10, num_accepted_tokens=9), None)
    stat_logger.log()
    stat_logger.record(0, SchedulerStats(1, 0, 0.5, num_draft_tokens=30, num_accepted_tokens=14), None)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zeroserve.stats"):
        stat_logger.log()
    [line] = lines(caplog)
    assert line.endswith("Preemptions: 0, Draft acceptance rate: 25.0%")  # 5 of the last 20


def test_silent_when_idle(caplog: pytest.LogCaptureFixture) -> None:
    stat_logger = LoggingStatLogger(interval_s=0.0)
    stat_logger.record(0, SchedulerStats(0, 0, 0.0, 10, 5, 0), IterationStats())
    with caplog.at_level(logging.INFO, logger="zeroserve.stats"):
        stat_logger.log()
        stat_logger.log()
    assert lines(caplog) == []


def test_an_engine_gone_is_no_longer_reported(caplog: pytest.LogCaptureFixture) -> None:
    stat_logger = LoggingStatLogger(interval_s=0.0)
    for engine_index in (0, 1):
        stat_logger.record(engine_index, SchedulerStats(2, 0, 0.1, 0, 0, 0), IterationStats())
    stat_logger.keep_engines([1])
    with caplog.at_level(logging.INFO, logger="zeroserve.stats"):
        stat_logger.log()
    assert [line[:11] for line in lines(caplog)] == ["Engine 001:"]
