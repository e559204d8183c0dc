"""GET /metrics on a real server: every metric is exposed and moves with the requests served;
with `--log-format json` each finished request is one parseable log line."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server_process import ServerProcess, running_server

METRIC_NAMES = (
    "zeroserve:num_requests_running",
    "zeroserve:num_requests_waiting",
    "zeroserve:kv_cache_usage_perc",
    "zeroserve:prefix_cache_queries_total",
    "zeroserve:prefix_cache_hits_total",
    "zeroserve:prompt_tokens_total",
    "zeroserve:generation_tokens_total",
    "zeroserve:request_success_total",
    "zeroserve:num_preemptions_total",
    "zeroserve:time_to_first_token_seconds_count",
    "zeroserve:inter_token_latency_seconds_count",
    "zeroserve:e2e_request_latency_seconds_count",
    "zeroserve:request_queue_time_seconds_count",
)
NUM_REQUESTS = 3
MAX_TOKENS = 5


@pytest.fixture(scope="module")
def log_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-log") / "server.log"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, log_file: Path) -> Iterator[ServerProcess]:
    # NOTE: one sequence at a time, so concurrent requests wait in the engine's queue.
    with running_server(tiny_model_dir, "--max-num-seqs", "1", "--log-format", "json", log_file=log_file) as server:
        yield server


def scrape(client: httpx.Client) -> dict[str, float]:
    """Every sample's value summed over its labels, by sample name (and `name{reason}` for
    request_success_total)."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            name = sample.name
            if name == "zeroserve:request_success_total":
                name += "{" + sample.labels["finished_reason"] + "}"
            totals[name] = totals.get(name, 0.0) + sample.value
            totals.setdefault(sample.name, 0.0)
    return totals


def eventually(read: Callable[[], Any], is_done: Callable[[Any], bool]) -> Any:
    """`read()` once `is_done` holds of it: stats and log lines land a moment after the responses, a
    longer moment on a busy machine (the deadline only bounds a wait that would never end)."""
    deadline = time.monotonic() + 120
    while not is_done(value := read()):
        assert time.monotonic() < deadline, value
        time.sleep(0.05)
    return value


def complete(base_url: str, prompt: str) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0}
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def send_concurrently(server: ServerProcess, prompts: list[str]) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda prompt: complete(server.base_url, prompt), prompts))


def test_metrics_move_by_what_the_requests_did(server: ServerProcess) -> None:
    prompts = [f"Metrics test {i}: the quick brown fox" for i in range(NUM_REQUESTS)]
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        before = scrape(client)
        results = send_concurrently(server, prompts)
        num_prompt = sum(r["usage"]["prompt_tokens"] for r in results)
        latencies = "zeroserve:e2e_request_latency_seconds_count"
        after = eventually(
            lambda: scrape(client), lambda after: after[latencies] - before.get(latencies, 0.0) >= NUM_REQUESTS
        )

    for name in METRIC_NAMES:
        assert name in after, name
    # NOTE: the token, request and latency counts' deltas: test_app_inproc.py. These come from a
    # real engine's scheduler stats.
    prefix_cache_queries = "zeroserve:prefix_cache_queries_total"
    assert after[prefix_cache_queries] - before.get(prefix_cache_queries, 0.0) >= num_prompt
    assert after["zeroserve:num_requests_running"] == 0
    assert after["zeroserve:num_requests_waiting"] == 0


def test_queue_time_is_recorded_from_the_engine_events(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        before = scrape(client)
        send_concurrently(server, [f"Queue test {i}: waiting in line" for i in range(NUM_REQUESTS)])
        name = "zeroserve:request_queue_time_seconds"
        after = eventually(
            lambda: scrape(client), lambda after: after[f"{name}_count"] - before.get(f"{name}_count", 0.0) >= NUM_REQUESTS
        )
    assert after[f"{name}_count"] - before.get(f"{name}_count", 0.0) == NUM_REQUESTS
    # NOTE: one sequence at a time: all but the first waited at least one whole request.
    assert after[f"{name}_sum"] - before.get(f"{name}_sum", 0.0) > 0.0


def test_json_log_has_one_parseable_line_per_finished_request(server: ServerProcess, log_file: Path) -> None:
    results = send_concurrently(server, ["Log test: one line per request", "Log test: another"])
    ids = {r["id"] for r in results}

    def finished_entries() -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        entries = [json.loads(line) for line in log_file.read_text().splitlines() if line.startswith("{")]
        return entries, {e["request_id"]: e for e in entries if e["logger"] == "zeroserve.request" and e["request_id"] in ids}

    entries, finished = eventually(finished_entries, lambda read: set(read[1]) == ids)
    assert set(finished) == ids
    for result in results:
        entry = finished[result["id"]]
        assert {"timestamp", "level", "message"} <= set(entry)
        assert entry["level"] == "INFO"
        assert entry["finish_reason"] == "length"
        assert entry["num_prompt_tokens"] == result["usage"]["prompt_tokens"]
        assert entry["num_generation_tokens"] == result["usage"]["completion_tokens"]
        assert 0 < entry["ttft"] <= entry["e2e_latency"]
    # NOTE: the HTTP server's own lines follow the format too, and so do the engine's.
    assert any(e["logger"].startswith("hypercorn") for e in entries)
    assert any(e["logger"].startswith("engine_proc") and "ready in" in e["message"] for e in entries)


def test_every_gateway_process_shows_the_totals_of_all(tiny_model_dir: Path, tmp_path: Path) -> None:
    num_requests = 8
    with running_server(
        tiny_model_dir, "--api-server-count", "2", "--kv-cache-memory", "0.05", log_file=tmp_path / "server.log"
    ) as server:
        results = send_concurrently(server, [f"Two gateways {i}: count me once" for i in range(num_requests)])
        num_prompt = sum(r["usage"]["prompt_tokens"] for r in results)

        def scrape_anew() -> dict[str, float]:
            # NOTE: a new connection per scrape, so the kernel picks either process each time.
            with httpx.Client(base_url=server.base_url, timeout=30) as client:
                return scrape(client)

        counted = "zeroserve:e2e_request_latency_seconds_count"
        scrapes = [eventually(scrape_anew, lambda samples: samples[counted] >= num_requests) for _ in range(6)]
    for samples in scrapes:
        assert samples["zeroserve:prompt_tokens_total"] == num_prompt
        assert samples["zeroserve:generation_tokens_total"] == num_requests * MAX_TOKENS
        assert samples["zeroserve:request_success_total{length}"] == num_requests
        assert samples["zeroserve:e2e_request_latency_seconds_count"] == num_requests
        assert samples["zeroserve:prefix_cache_queries_total"] >= num_prompt
        assert samples["zeroserve:num_requests_running"] == 0
