"""Settings of one `zeroserve bench serve` run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from service.bench.datasets import Endpoint
from service.bench.metrics import LATENCY_METRICS
from service.model_files.model_registry import DEFAULT_MODEL

_ENDPOINT_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class ServeBenchConfig:
    """What to send, to which server, how fast; validated on construction."""

    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None
    endpoint: Endpoint = "completions"
    tokenizer: str = DEFAULT_MODEL
    dataset: Literal["random", "chat", "jsonl"] = "random"
    dataset_path: Path | None = None
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    ignore_eos: bool = False
    seed: int = 0
    num_warmups: int = 0
    goodput_slos_ms: dict[str, float] = field(default_factory=dict)
    percentile_metrics: tuple[str, ...] = LATENCY_METRICS
    metric_percentiles: tuple[float, ...] = (99.0,)
    result_json: Path | None = None
    disable_tqdm: bool = False
    ready_check_timeout_s: float = 600.0


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
    def server_root(self) -> str:
        """The base URL without a trailing `/v1`, which users often include."""
        return self.base_url.rstrip("/").removesuffix("/v1")

    @property
    def api_url(self) -> str:
        return self.server_root + _ENDPOINT_PATHS[self.endpoint]

    @property
    def models_url(self) -> str:
        return self.server_root + "/v1/models"
