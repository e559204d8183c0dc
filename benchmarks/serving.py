"""Serving benchmark over the full HTTP path: throughput and latency at several concurrencies.

    .venv/bin/python -m benchmarks.serving                      # starts a server, 1/4/16/64 streams
    .venv/bin/python -m benchmarks.serving --prefix             # shared 2,000-token system prompt
    .venv/bin/python -m benchmarks.serving --base-url http://127.0.0.1:8000   # a running server

Each stream sends a distinct ~230-token prompt to /v1/completions (streamed, greedy,
`ignore_eos`, 128 output tokens). Reported per concurrency: output tokens/s over the whole
run, and percentiles of time to first token (TTFT) and inter-token latency (ITL, the gaps
between streamed chunks). `--prefix` sends 16 requests one after another that share a
2,000-token prefix and reports each one's TTFT. The started server runs bf16 weights on
2 threads by default (`--server-args` changes that; PERF_NOTES.md says why bf16).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import httpx

from service.model_registry import DEFAULT_MODEL, resolve_model
from service.tokenizer import Tokenizer

_TEXT = (
    "The history of computing is a story of people who wanted machines to do arithmetic for them, "
    "and then found that the machines could do much more. Early mechanical calculators gave way to "
    "relays, then vacuum tubes, transistors and integrated circuits; each step made computers smaller, "
    "faster and cheaper, and each opened new uses that nobody had planned. "
)


@dataclass
class StreamResult:
    """Timings of one streamed request."""

    ttft_s: float = 0.0
    itls_s: list[float] = field(default_factory=list)
    num_output_tokens: int = 0


def make_prompts(tokenizer: Tokenizer, num_prompts: int, num_tokens: int, seed_text: str = "") -> list[list[int]]:
    """Distinct prompts of exactly `num_tokens` token ids (distinct heads, so no shared prefix)."""
    body = tokenizer.encode(_TEXT * (1 + num_tokens // 40))
    prompts = []
    for i in range(num_prompts):
        head = tokenizer.encode(f"{seed_text}Request {i}. ")
        prompts.append((head + body)[:num_tokens])
    return prompts


async def stream_one(client: httpx.AsyncClient, model: str, prompt: list[int], max_tokens: int) -> StreamResult:
    body: dict[str, Any] = {
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }
    result = StreamResult()
    started = last = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            if chunk.get("usage"):
                result.num_output_tokens = chunk["usage"]["completion_tokens"]
            if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            if result.ttft_s == 0.0:
                result.ttft_s = now - started
            else:
                result.itls_s.append(now - last)
            last = now
    if result.num_output_tokens == 0:
        result.num_output_tokens = max_tokens  # NOTE: ignore_eos: every request runs to max_tokens
    return result


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    picked = [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.9, 0.99)]
    return " ".join(f"{1000 * value:7.0f}" for value in picked)


async def run_concurrency(
    client: httpx.AsyncClient, model: str, prompts: list[list[int]], max_tokens: int
) -> tuple[float, list[StreamResult]]:
    started = time.perf_counter()
    results = await asyncio.gather(*(stream_one(client, model, p, max_tokens) for p in prompts))
    return time.perf_counter() - started, list(results)


async def throughput(base_url: str, model: str, tokenizer: Tokenizer, args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=None) as client:
        await run_concurrency(client, model, make_prompts(tokenizer, 1, args.prompt_tokens, "Warm-up. "), 8)
        print(f"prompt {args.prompt_tokens} tokens, {args.max_tokens} output tokens, greedy, ignore_eos")
        print("streams  out tok/s  speedup |  TTFT ms p50/p90/p99   |  ITL ms p50/p90/p99")
        single = 0.0
        for concurrency in args.concurrency:
            prompts = make_prompts(tokenizer, concurrency, args.prompt_tokens, f"Run {concurrency}. ")
            elapsed, results = await run_concurrency(client, model, prompts, args.max_tokens)
            tok_s = sum(r.num_output_tokens for r in results) / elapsed
            single = single or tok_s
            ttfts = [r.ttft_s for r in results]
            itls = [itl for r in results for itl in r.itls_s]
            print(f"{concurrency:7d}  {tok_s:9.1f}  {tok_s / single:6.1f}x | {percentiles(ttfts)} | {percentiles(itls)}",
                  flush=True)


async def shared_prefix(base_url: str, model: str, tokenizer: Tokenizer, args: argparse.Namespace) -> None:
    system = make_prompts(tokenizer, 1, args.prefix_tokens, "You are a careful assistant. ")[0]
    async with httpx.AsyncClient(base_url=base_url, timeout=None) as client:
        await run_concurrency(client, model, make_prompts(tokenizer, 1, 32, "Warm-up. "), 2)
        ttfts = []
        for i in range(args.num_prefix_requests):
            question = tokenizer.encode(f" Question {i}: what happened in step {i * 7} of the story?")
            (result,) = (await run_concurrency(client, model, [system + question], 4))[1]
            ttfts.append(result.ttft_s)
            print(f"request {i + 1:2d}: {len(system) + len(question)} prompt tokens, TTFT {1000 * result.ttft_s:7.0f} ms",
                  flush=True)
        print(f"last / first TTFT: {ttfts[-1] / ttfts[0]:.3f} (median of 2..{len(ttfts)}: "
              f"{statistics.median(ttfts[1:]) / ttfts[0]:.3f})")


@contextmanager
def started_server(model: str, server_args: list[str]) -> Iterator[str]:
    from tests.server_process import running_server

    with running_server(model, *server_args, timeout=600.0) as server:
        yield server.base_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--base-url", default=None, help="a running server; by default one is started")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--prompt-tokens", type=int, default=230)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prefix", action="store_true", help="measure TTFT with a shared system prompt")
    parser.add_argument("--prefix-tokens", type=int, default=2000)
    parser.add_argument("--num-prefix-requests", type=int, default=16)
    parser.add_argument(
        "--server-args", default="--num-threads 2 --dtype bfloat16 --kv-cache-memory 2 --max-model-len 4096",
        help="extra `zeroserve serve` flags for the started server (default: %(default)s)",
    )
    args = parser.parse_args()
    tokenizer = Tokenizer.from_model(resolve_model(args.model).path)
    server = nullcontext(args.base_url) if args.base_url else started_server(args.model, args.server_args.split())
    with server as base_url:
        with httpx.Client(base_url=base_url) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
        run = shared_prefix if args.prefix else throughput
        asyncio.run(run(base_url, model, tokenizer, args))


if __name__ == "__main__":
    main()
