"""Benchmark figures from request outputs, computed as `vllm bench serve` computes them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    # NOTE: for annotations only: `zeroserve`'s parser reads this module's names, and aiohttp takes 0.16 s.
    from service.bench.request_func import RequestFuncOutput

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class LatencyStats:
    """Mean, median, standard deviation and chosen percentiles of one latency, in ms."""

    mean_ms: float
    median_ms: float
    std_ms: float
    percentiles_ms: tuple[tuple[float, float], ...]


@dataclass(frozen=True)
class BenchmarkMetrics:
    """A run's totals, throughputs (per second of the run) and latency statistics."""

    completed: int
    failed: int
    total_input: int
    total_output: int
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    latencies: dict[str, LatencyStats]


def latency_stats(values_s: Sequence[float], percentiles: Sequence[float]) -> LatencyStats:
    """Statistics of `values_s` (seconds) in ms; all zero when there are none."""
    values = np.asarray(values_s if len(values_s) else [0.0], dtype=np.float64) * 1000
    return LatencyStats(
        mean_ms=float(np.mean(values)),
        median_ms=float(np.median(values)),
        std_ms=float(np.std(values)),
        percentiles_ms=tuple((float(p), float(np.percentile(values, p))) for p in percentiles),
    )


def request_tpot(output: RequestFuncOutput, num_output_tokens: int) -> float:
    """Time per output token after the first; 0 for a request of at most one token."""
    if num_output_tokens <= 1:
        return 0.0
    return (output.latency - output.ttft) / (num_output_tokens - 1)


def is_good(output: RequestFuncOutput, num_output_tokens: int, slos_ms: dict[str, float]) -> bool:
    """Whether a successful request met every service-level objective asked (ttft, tpot, e2el in ms)."""
    measured_s = {"ttft": output.ttft, "tpot": request_tpot(output, num_output_tokens), "e2el": output.latency}
    return all(measured_s[name] * 1000 <= limit_ms for name, limit_ms in slos_ms.items())


def calculate_metrics(
    outputs: Sequence[RequestFuncOutput],
    output_lens: Sequence[int],
    duration_s: float,
    percentiles: Sequence[float] = (99.0,),
    goodput_slos_ms: dict[str, float] | None = None,
) -> BenchmarkMetrics:
    """The run's figures; `output_lens[i]` is request i's output token count (0 when it failed).

    TPOT leaves out requests of one token (their TPOT is undefined); ITL pools every
    request's chunk gaps; goodput counts successful requests within all the SLOs.
    """
    done = [(out, n) for out, n in zip(outputs, output_lens, strict=False) if out.success]
    total_input = sum(out.prompt_len for out, _ in done)
    total_output = sum(n for _, n in done)
    samples = {
        "ttft": [out.ttft for out, _ in done],
        "tpot": [request_tpot(out, n) for out, n in done if n > 1],
        "itl": [gap for out, _ in done for gap in out.itl],
        "e2el": [out.latency for out, _ in done],
    }
    goodput = None
    if goodput_slos_ms:
        goodput = sum(is_good(out, n, goodput_slos_ms) for out, n in done) / duration_s
    return BenchmarkMetrics(
        completed=len(done),
        failed=len(outputs) - len(done),
        total_input=total_input,
        total_output=total_output,
        request_throughput=len(done) / duration_s,
        request_goodput=goodput,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        latencies={name: latency_stats(samples[name], percentiles) for name in LATENCY_METRICS},
    )


def goodput_slo(spec: str) -> tuple[str, float]:
    """`"ttft:500"` → ("ttft", 500.0): one service-level objective in ms; a bad one raises ValueError."""
    name, sep, value = spec.partition(":")
    if not sep or name not in GOODPUT_METRICS:
        raise ValueError(f"takes NAME:MS with NAME one of {', '.join(GOODPUT_METRICS)}, got {spec!r}")
    try:
        limit_ms = float(value)
    except ValueError:
        raise ValueError(f"{spec!r}: {value!r} is not a number of ms") from None
    if limit_ms < 0:
        raise ValueError(f"{spec!r}: the limit must not be negative")
    return name, limit_ms
