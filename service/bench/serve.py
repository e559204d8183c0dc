"""`zeroserve bench serve`: stream a dataset's requests at a server, then report as vLLM does."""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import httpx
from tqdm import tqdm

from service.bench.arrivals import arrival_offsets
from service.bench.chat_prompts import chat_dataset
from service.bench.datasets import SampleRequest, jsonl_dataset, random_dataset
from service.bench.metrics import calculate_metrics
from service.bench.report import format_report, result_dict
from service.bench.request_func import RequestFuncInput, RequestFuncOutput, request_openai_stream, streaming_body
from service.bench.serve_config import ServeBenchConfig
from service.model_files.model_registry import resolve_model
from service.model_files.tokenizer import Tokenizer

_CONNECT_TIMEOUT_S = 10.0
_READY_POLL_S = 0.5
_WARMUP_SEED_OFFSET = 7919


def run_serve_benchmark(config: ServeBenchConfig) -> int:
    """Runs the benchmark, prints the report, writes the JSON; 1 when no request succeeded."""
    tokenizer = Tokenizer.from_model(resolve_model(config.tokenizer).path)
    samples = load_samples(config, tokenizer)
    model_id, outputs, duration_s = asyncio.run(benchmark(config, samples, load_warmup_samples(config, tokenizer, samples)))
    output_lens = [count_output_tokens(out, tokenizer) for out in outputs]
    metrics = calculate_metrics(
        outputs, output_lens, duration_s, config.metric_percentiles, config.goodput_slos or None
    )
    print(format_report(config, metrics, duration_s), flush=True)
    if config.result_json is not None:
        result = result_dict(config, model_id, metrics, outputs, output_lens, duration_s)
        result["server_version"] = server_version(config.base_url)
        config.result_json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if metrics.completed == 0:
        first_error = next((out.error for out in outputs if out.error), "")
        print(f"zeroserve bench serve: error: every request failed; the first: {first_error}", file=sys.stderr)
        return 1
    return 0


def server_version(base_url: str) -> dict[str, Any] | None:
    """The server's /version (zeroserve's names its CPU and kernel choices), or None where it has none."""
    try:
        response = httpx.get(f"{base_url.rstrip('/')}/version", timeout=_CONNECT_TIMEOUT_S)
        body = response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def load_samples(config: ServeBenchConfig, tokenizer: Tokenizer) -> list[SampleRequest]:
    if config.dataset_kind == "jsonl":
        assert config.dataset_path is not None
        return jsonl_dataset(tokenizer, config.endpoint, config.dataset_path, config.num_prompts)
    if config.dataset_kind == "chat":
        return chat_dataset(
            tokenizer, config.endpoint, config.num_prompts, config.random_input_len, config.random_output_len, config.seed
        )
    return random_dataset(
        tokenizer, config.endpoint, config.num_prompts, config.random_input_len, config.random_output_len,
        config.random_range_ratio, config.seed,
    )


def load_warmup_samples(
    config: ServeBenchConfig, tokenizer: Tokenizer, samples: Sequence[SampleRequest]
) -> list[SampleRequest]:
    """Warm-up requests: random prompts of their own (none of the measured ones reaches the server
    first, to be served from its prefix cache); a file's first requests, repeated as needed."""
    if config.dataset_kind == "jsonl":
        return [samples[i % len(samples)] for i in range(config.num_warmups)] if samples else []
    return random_dataset(
        tokenizer, config.endpoint, config.num_warmups, config.random_input_len, config.random_output_len,
        config.random_range_ratio, config.seed + _WARMUP_SEED_OFFSET,
    )


def count_output_tokens(output: RequestFuncOutput, tokenizer: Tokenizer) -> int:
    """The server's usage count when it sent one, else the generated text's tokens; 0 if it failed."""
    if not output.success:
        return 0
    if output.output_tokens is not None:
        return output.output_tokens
    return len(tokenizer.encode(output.generated_text))


async def benchmark(
    config: ServeBenchConfig, samples: Sequence[SampleRequest], warmup_samples: Sequence[SampleRequest] = ()
) -> tuple[str, list[RequestFuncOutput], float]:
    """(model id, one output per sample, duration in s) of a run after its warm-up requests."""
    # NOTE: a connection per request: llama.cpp's server closes an idle kept-alive connection after
    # 5 s, and a request sent on one it closed failed ("Can not write request body"); on loopback a
    # new connection costs well under a millisecond of a request's seconds.
    connector = aiohttp.TCPConnector(limit=config.max_concurrency or 0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=None, connect=_CONNECT_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else None
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as client:
        await wait_until_ready(client, config)
        model_id = config.model or await fetch_model_id(client, config)
        inputs, warmups = (
            [RequestFuncInput(config.api_url, streaming_body(s.body, model_id, config.ignore_eos), s.prompt_len) for s in group]
            for group in (samples, warmup_samples)
        )
        semaphore = asyncio.Semaphore(config.max_concurrency or len(inputs) + len(warmups))
        if warmups:
            print(f"Warming up with {len(warmups)} requests...", flush=True)
            warmup_outputs = await asyncio.gather(*(_limited(client, semaphore, r, None) for r in warmups))
            if failed := [out.error for out in warmup_outputs if not out.success]:
                print(f"warning: {len(failed)} warm-up requests failed; the first: {failed[0]}", file=sys.stderr)
        print(_traffic_line(config), flush=True)
        offsets = arrival_offsets(len(inputs), config.request_rate, config.burstiness, config.seed)
        with tqdm(total=len(inputs), disable=config.disable_tqdm) as progress:
            start = time.perf_counter()
            tasks = []
            for offset, request in zip(offsets, inputs, strict=False):
                delay = start + offset - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(_limited(client, semaphore, request, progress)))
            outputs = await asyncio.gather(*tasks)
            duration_s = time.perf_counter() - start
    return model_id, list(outputs), duration_s


async def wait_until_ready(client: aiohttp.ClientSession, config: ServeBenchConfig) -> None:
    """Returns once the server lists its models (a server just started may still be loading),
    or raises OSError after `ready_check_timeout_s`, as `vllm bench serve`'s ready check; at once
    when the server refuses the key (no waiting changes that)."""
    if not config.ready_check_timeout_s:
        return
    deadline = time.monotonic() + config.ready_check_timeout_s
    is_told = False
    while True:
        try:
            async with client.get(config.models_url) as response:
                if response.status == 200:
                    return
                if response.status in (401, 403):
                    raise OSError(_refused_key(config, response.status))
                status = f"HTTP {response.status}"
        except aiohttp.ClientError as exc:
            status = f"{type(exc).__name__}"
        if time.monotonic() >= deadline:
            raise OSError(f"the server at {config.server_root} did not answer in {config.ready_check_timeout_s:g} s ({status})")
        if not is_told:
            print(f"Waiting up to {config.ready_check_timeout_s:g} s for the server at {config.server_root}...", flush=True)
            is_told = True
        await asyncio.sleep(_READY_POLL_S)


def _refused_key(config: ServeBenchConfig, status: int) -> str:
    if config.api_key:
        return f"the server at {config.server_root} refused the key given with --api-key (HTTP {status})"
    return f"the server at {config.server_root} needs an API key (HTTP {status}): give it with --api-key KEY"


async def fetch_model_id(client: aiohttp.ClientSession, config: ServeBenchConfig) -> str:
    """The first model the server lists; the tokenizer's name when the server does not answer."""
    try:
        async with client.get(config.models_url, raise_for_status=True) as response:
            return str((await response.json())["data"][0]["id"])
    except (aiohttp.ClientError, ValueError, KeyError, IndexError, TypeError) as exc:
        print(
            f"warning: could not read the model from {config.models_url} ({type(exc).__name__}: {exc}); "
            f"sending model {config.tokenizer!r}",
            file=sys.stderr,
        )
        return config.tokenizer


async def _limited(
    client: aiohttp.ClientSession, semaphore: asyncio.Semaphore, request: RequestFuncInput, progress: tqdm[Any] | None
) -> RequestFuncOutput:
    async with semaphore:
        output = await request_openai_stream(client, request)
    if progress is not None:
        progress.update(1)
    return output


def _traffic_line(config: ServeBenchConfig) -> str:
    rate = "inf" if math.isinf(config.request_rate) else f"{config.request_rate:g}"
    process = "Poisson process" if config.burstiness == 1.0 else "gamma distribution"
    concurrency = config.max_concurrency if config.max_concurrency is not None else "unlimited"
    return (
        f"Traffic request rate: {rate} req/s, burstiness {config.burstiness:g} ({process}), "
        f"maximum request concurrency: {concurrency}"
    )
