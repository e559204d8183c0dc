"""Request timings from engine timestamps and events."""

from __future__ import annotations

import pytest

from proto.engine_output import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput
from service.observability.stats import IterationStats, RequestStateStats


def test_first_token_then_inter_token_latencies_then_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    stats = RequestStateStats(arrival_time=10.0)
    first = IterationStats()
    events = [EngineCoreEvent(EngineCoreEventType.QUEUED, 10.5), EngineCoreEvent(EngineCoreEventType.SCHEDULED, 11.0)]
    first.update_from_output(EngineCoreOutput("r", [5], events=events), 12.0, num_prompt_tokens=7, stats=stats)
    assert (first.num_prompt_tokens, first.num_generation_tokens) == (7, 1)
    assert first.time_to_first_tokens == [2.0] and first.inter_token_latencies == []
    second = IterationStats()
    second.update_from_output(EngineCoreOutput("r", [6, 7]), 12.5, num_prompt_tokens=7, stats=stats)
    assert (second.num_prompt_tokens, second.num_generation_tokens) == (0, 2)
    assert second.inter_token_latencies == [0.5]
    monkeypatch.setattr("service.observability.stats.time.time", lambda: 13.0)
    second.update_from_finished_request("r", "length", 7, 0, stats)
    [done] = second.finished_requests
    assert (done.request_id, done.finish_reason, done.num_generation_tokens) == ("r", "length", 3)
    assert (done.e2e_latency, done.ttft, done.queued_time) == (3.0, 2.0, 0.5)
    assert (done.prefill_time, done.decode_time, done.inference_time) == (1.0, 0.5, 1.5)
