"""The printed report of a serving benchmark and its result JSON, in `vllm bench serve`'s shape."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from service.bench.metrics import BenchmarkMetrics
from service.bench.request_func import RequestFuncOutput
from service.bench.serve_config import ServeBenchConfig

_WIDTH = 50
_SECTIONS = {
    "ttft": ("Time to First Token", "TTFT"),
    "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
    "itl": ("Inter-token Latency", "ITL"),
    "e2el": ("End-to-end Latency", "E2EL"),
}


def format_report(config: ServeBenchConfig, metrics: BenchmarkMetrics, duration_s: float) -> str:
    """The result table, line for line as `vllm bench serve` prints it."""
    lines = [f"{' Serving Benchmark Result ':=^{_WIDTH}}"]

    def row(label: str, value: object, fmt: str = "") -> None:
        lines.append(f"{label:<40} {value:<10{fmt}}")

    row("Successful requests:", metrics.completed)
    row("Failed requests:", metrics.failed)
    if config.max_concurrency is not None:
        row("Maximum request concurrency:", config.max_concurrency)
    if not math.isinf(config.request_rate):
        row("Request rate configured (RPS):", config.request_rate, ".2f")
    row("Benchmark duration (s):", duration_s, ".2f")
    row("Total input tokens:", metrics.total_input)
    row("Total generated tokens:", metrics.total_output)
    row("Request throughput (req/s):", metrics.request_throughput, ".2f")
    if metrics.request_goodput is not None:
        row("Request goodput (req/s):", metrics.request_goodput, ".2f")
    row("Output token throughput (tok/s):", metrics.output_throughput, ".2f")
    row("Total Token throughput (tok/s):", metrics.total_token_throughput, ".2f")
    for name in config.percentile_metrics:
        title, short = _SECTIONS[name]
        stats = metrics.latencies[name]
        lines.append(f"{title:-^{_WIDTH}}")
        row(f"Mean {short} (ms):", stats.mean_ms, ".2f")
        row(f"Median {short} (ms):", stats.median_ms, ".2f")
        for p, value in stats.percentiles_ms:
            row(f"P{p:g} {short} (ms):", value, ".2f")
    lines.append("=" * _WIDTH)
    return "\n".join(lines)


def result_dict(
    config: ServeBenchConfig,
    model_id: str,
    metrics: BenchmarkMetrics,
    outputs: Sequence[RequestFuncOutput],
    output_lens: Sequence[int],
    duration_s: float,
) -> dict[str, Any]:
    """The run as `vllm bench serve --save-result` writes it (vLLM's key names)."""
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "backend": "openai-chat" if config.endpoint == "chat" else "openai",
        "endpoint_type": config.endpoint,
        "base_url": config.base_url,
        "model_id": model_id,
        "tokenizer_id": config.tokenizer,
        "num_prompts": config.num_prompts,
        "request_rate": "inf" if math.isinf(config.request_rate) else config.request_rate,
        "burstiness": config.burstiness,
        "max_concurrency": config.max_concurrency,
        "duration": duration_s,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "total_input_tokens": metrics.total_input,
        "total_output_tokens": metrics.total_output,
        "request_throughput": metrics.request_throughput,
        "request_goodput": metrics.request_goodput,
        "output_throughput": metrics.output_throughput,
        "total_token_throughput": metrics.total_token_throughput,
        "input_lens": [out.prompt_len for out in outputs],
        "output_lens": list(output_lens),
        "ttfts": [out.ttft for out in outputs],
        "itls": [out.itl for out in outputs],
        "generated_texts": [out.generated_text for out in outputs],
        "errors": [out.error for out in outputs],
    }
    if config.goodput_slos:
        result["goodput"] = config.goodput_slos
    for name, stats in metrics.latencies.items():
        result[f"mean_{name}_ms"] = stats.mean_ms
        result[f"median_{name}_ms"] = stats.median_ms
        result[f"std_{name}_ms"] = stats.std_ms
        for p, value in stats.percentiles_ms:
            result[f"p{p:g}_{name}_ms"] = value
    return result
