"""RequestLogger: one info line per finished request, its figures on the record as fields."""

from __future__ import annotations

import logging

import pytest

from proto.engine_output import SchedulerStats
from service.observability.request_log import RequestLogger
from service.observability.stats import FinishedRequestStats, IterationStats


def finished(request_id: str) -> FinishedRequestStats:
    return FinishedRequestStats(
        request_id=request_id, finish_reason="stop", e2e_latency=0.5, num_prompt_tokens=7,
        num_generation_tokens=4, num_cached_tokens=0, ttft=0.125, queued_time=0.01,
        prefill_time=0.1, decode_time=0.3, inference_time=0.4,
    )


def test_one_line_per_finished_request_with_its_figures(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zeroserve.request")
    request_logger = RequestLogger()
    request_logger.record(0, SchedulerStats(), IterationStats(num_generation_tokens=3))
    request_logger.record(0, None, IterationStats(finished_requests=[finished("a"), finished("b")]))
    records = [r for r in caplog.records if r.name == "zeroserve.request"]
    assert [r.getMessage() for r in records] == [
        f"request {rid} finished (stop): 7 prompt tokens, 4 output tokens, TTFT 0.125s, total 0.500s"
        for rid in ("a", "b")
    ]
    assert records[0].levelno == logging.INFO
    assert vars(records[1])["request_id"] == "b"
    assert vars(records[1])["num_generation_tokens"] == 4
    assert vars(records[1])["ttft"] == 0.125


def test_silent_when_info_is_off(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="zeroserve.request")
    RequestLogger().record(0, None, IterationStats(finished_requests=[finished("a")]))
    assert not [r for r in caplog.records if r.name == "zeroserve.request"]
