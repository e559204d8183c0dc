"""Benchmark figures on hand-built request outputs, the expected values worked out by hand."""

from __future__ import annotations

import math
import re

import pytest

from service.bench.metrics import calculate_metrics, goodput_slo
from service.bench.request_func import RequestFuncOutput


def outputs() -> tuple[list[RequestFuncOutput], list[int]]:
    """Three successes (5, 2 and 1 output tokens) and one failure; times in seconds."""
    return [
        RequestFuncOutput(success=True, prompt_len=10, ttft=0.1, latency=1.1, itl=[0.2, 0.3, 0.5]),
        RequestFuncOutput(success=True, prompt_len=20, ttft=0.3, latency=0.5, itl=[0.2]),
        RequestFuncOutput(success=True, prompt_len=30, ttft=0.2, latency=0.2),
        RequestFuncOutput(success=False, prompt_len=40, error="HTTP 500: boom"),
    ], [5, 2, 1, 0]


def test_totals_and_throughputs_count_only_successes() -> None:
    metrics = calculate_metrics(*outputs(), duration_s=2.0)
    assert (metrics.completed, metrics.failed) == (3, 1)
    assert (metrics.total_input, metrics.total_output) == (60, 8)
    assert metrics.request_throughput == pytest.approx(1.5)
    assert metrics.output_throughput == pytest.approx(4.0)
    assert metrics.total_token_throughput == pytest.approx(34.0)
    assert metrics.request_goodput is None


def test_ttft_mean_median_std_and_p99() -> None:
    ttft = calculate_metrics(*outputs(), duration_s=2.0).latencies["ttft"]
    # ms: 100, 300, 200; p99 interpolates between the 2nd and 3rd of the sorted values at 0.98.
    assert ttft.mean_ms == pytest.approx(200.0)
    assert ttft.median_ms == pytest.approx(200.0)
    assert ttft.std_ms == pytest.approx(math.sqrt((100**2 + 0 + 100**2) / 3))
    assert dict(ttft.percentiles_ms) == pytest.approx({99.0: 200 + 0.98 * 100})


def test_tpot_excludes_the_first_token_and_one_token_requests() -> None:
    tpot = calculate_metrics(*outputs(), duration_s=2.0).latencies["tpot"]
    # (1.1 − 0.1) / 4 = 250 ms and (0.5 − 0.3) / 1 = 200 ms; the one-token request has none.
    assert tpot.mean_ms == pytest.approx(225.0)
    assert tpot.median_ms == pytest.approx(225.0)
    assert dict(tpot.percentiles_ms)[99.0] == pytest.approx(200 + 0.99 * 50)


def test_itl_pools_every_chunk_gap_and_e2el_is_latency() -> None:
    metrics = calculate_metrics(*outputs(), duration_s=2.0, percentiles=(50.0, 99.0))
    itl, e2el = metrics.latencies["itl"], metrics.latencies["e2el"]
    # ITL ms sorted: 200, 200, 300, 500 → p99 at index 2.97.
    assert itl.mean_ms == pytest.approx(300.0)
    assert itl.median_ms == pytest.approx(250.0)
    assert dict(itl.percentiles_ms) == pytest.approx({50.0: 250.0, 99.0: 300 + 0.97 * 200})
    # E2EL ms sorted: 200, 500, 1100.
    assert e2el.mean_ms == pytest.approx(600.0)
    assert dict(e2el.percentiles_ms)[99.0] == pytest.approx(500 + 0.98 * 600)


def test_goodput_counts_requests_within_every_slo() -> None:
    # ttft ≤ 250 and tpot ≤ 240: the first fails tpot (250), the second ttft (300); the
    # one-token request has tpot 0 and passes.
    strict = calculate_metrics(*outputs(), duration_s=2.0, goodput_slos_ms={"ttft": 250, "tpot": 240})
    assert strict.request_goodput == pytest.approx(0.5)
    by_e2el = calculate_metrics(*outputs(), duration_s=2.0, goodput_slos_ms={"e2el": 1000})
    assert by_e2el.request_goodput == pytest.approx(1.0)


def test_a_run_without_successes_reports_zeros() -> None:
    failed = [RequestFuncOutput(error="ConnectError")] * 3
    metrics = calculate_metrics(failed, [0, 0, 0], duration_s=0.5)
    assert (metrics.completed, metrics.failed, metrics.total_output) == (0, 3, 0)
    assert metrics.latencies["ttft"].mean_ms == 0.0


def test_goodput_slo() -> None:
    assert [goodput_slo(spec) for spec in ("ttft:500", "tpot:50.5", "e2el:3000")] == [
        ("ttft", 500.0), ("tpot", 50.5), ("e2el", 3000.0)
    ]
    for bad in ("itl:5", "ttft", "ttft:fast", "tpot:-1"):
        with pytest.raises(ValueError, match=re.escape(repr(bad))):
            goodput_slo(bad)
