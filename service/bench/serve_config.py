"""Settings of one `zeroserve bench serve` run, declared once: `bench serve`'s flags are generated from
these fields (service/bench/cli.py), and `bench throughput` takes those of SHARED_SETTINGS."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from proto.settings import setting
from service.bench.datasets import Endpoint
from service.bench.metrics import LATENCY_METRICS, goodput_slo
from service.model_files.model_registry import DEFAULT_MODEL

Dataset = Literal["random", "chat", "jsonl"]

_ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
# the settings of the prompts themselves, which `bench throughput` takes too
SHARED_SETTINGS = (
    "dataset_path", "num_prompts", "random_input_len", "random_output_len", "random_range_ratio", "seed",
    "num_warmups", "disable_tqdm",
)


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _percentiles(text: str) -> tuple[float, ...]:
    return tuple(float(p) for p in text.split(","))


@dataclass(frozen=True)
class ServeBenchConfig:
    """What to send, to which server, how fast; validated on construction."""

    base_url: str = setting("http://127.0.0.1:8000", "the server")
    model: str | None = setting(None, "model to ask for (default: the first the server lists)")
    api_key: str | None = setting(
        None, "sent as `Authorization: Bearer KEY`, for a server started with --api-key (default: none)", metavar="KEY",
    )
    endpoint: Endpoint = setting("completions", "the OpenAI route to send to", choices=get_args(Endpoint), parse=str)
    tokenizer: str = setting(DEFAULT_MODEL, "model name or path whose tokenizer sizes the prompts and counts tokens")
    dataset: Dataset | None = setting(
        None, "random tokens, natural chat requests (sized by --random-input-len), or a file (default: random, "
        "jsonl with --dataset-path)", choices=get_args(Dataset), parse=str,
    )
    dataset_path: Path | None = setting(
        None, "a JSONL file of OpenAI request bodies, one a line, in place of made-up prompts (bench serve: "
        "implies --dataset jsonl; bench throughput: completions bodies)", parse=Path,
    )
    num_prompts: int = setting(1000, "requests to run")
    random_input_len: int = setting(1024, "prompt tokens")
    random_output_len: int = setting(128, "max_tokens")
    random_range_ratio: float = setting(0.0, "lengths drawn from [len·(1−r), len·(1+r)]; 0 gives exact lengths")
    max_concurrency: int | None = setting(None, "most requests in flight (default: all)")
    request_rate: float = setting(math.inf, "requests per second, Poisson arrivals; inf sends all at once")
    burstiness: float = setting(1.0, "gamma shape of the arrival gaps: 1 is Poisson, lower is burstier")
    ignore_eos: bool = setting(False, "send ignore_eos: every request runs to max_tokens")
    seed: int = setting(0, "seeds the prompts (and bench serve's arrivals)")
    num_warmups: int = setting(0, "requests run first, left out of the results")
    goodput_slos_ms: tuple[tuple[str, float], ...] = setting(
        (), "service-level objectives for goodput, e.g. ttft:500 tpot:50 e2el:5000 (default: none)",
        flag="--goodput", nargs="+", metavar="NAME:MS", parse=goodput_slo,
    )
    percentile_metrics: tuple[str, ...] = setting(
        LATENCY_METRICS, "latencies to report, comma-separated", metavar="NAMES", parse=_names
    )
    metric_percentiles: tuple[float, ...] = setting(
        (99.0,), "percentiles to report, comma-separated", metavar="PERCENTILES", parse=_percentiles
    )
    result_json: Path | None = setting(None, "write the results to this JSON file", parse=Path)
    disable_tqdm: bool = setting(False, "no progress bar")
    ready_check_timeout_s: float = setting(
        600.0, "wait this long for the server to answer before the run (a server still loading); 0: do not wait",
        flag="--ready-check-timeout-sec", metavar="SECONDS",
    )

    def __post_init__(self) -> None:
        if self.dataset == "jsonl" and self.dataset_path is None:
            raise ValueError("--dataset jsonl needs --dataset-path")
        if self.num_prompts < 1 or self.num_warmups < 0:
            raise ValueError("--num-prompts must be at least 1 and --num-warmups not negative")
        if self.random_input_len < 1 or self.random_output_len < 1:
            raise ValueError("--random-input-len and --random-output-len must be at least 1")
        if not 0.0 <= self.random_range_ratio < 1.0:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got {self.random_range_ratio}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("--max-concurrency must be at least 1")
        if not self.request_rate > 0 or not self.burstiness > 0:
            raise ValueError("--request-rate and --burstiness must be positive")
        if unknown := set(self.percentile_metrics) - set(LATENCY_METRICS):
            raise ValueError(f"--percentile-metrics: unknown {sorted(unknown)}; choose from {LATENCY_METRICS}")
        if not self.ready_check_timeout_s >= 0:
            raise ValueError("--ready-check-timeout-sec must not be negative")
        if not all(0 < p <= 100 for p in self.metric_percentiles):
            raise ValueError("--metric-percentiles must lie in (0, 100]")

    @property
    def dataset_kind(self) -> Dataset:
        """The dataset asked for; else a file's when --dataset-path is given, else random prompts."""
        return self.dataset or ("jsonl" if self.dataset_path is not None else "random")

    @property
    def goodput_slos(self) -> dict[str, float]:
        """Each goodput metric's limit in ms (a metric given twice: its last)."""
        return dict(self.goodput_slos_ms)

    @property
    def server_root(self) -> str:
        """The base URL without a trailing `/v1`, which users often include."""
        return self.base_url.rstrip("/").removesuffix("/v1")

    @property
    def api_url(self) -> str:
        return self.server_root + _ENDPOINT_PATHS[self.endpoint]

    @property
    def models_url(self) -> str:
        return self.server_root + "/v1/models"
