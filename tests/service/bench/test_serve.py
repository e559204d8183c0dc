"""`zeroserve bench serve` as a user runs it: a real process against a real server."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_process import free_port, running_server

HEADLINES = (
    "============ Serving Benchmark Result ============",
    "Successful requests:",
    "Failed requests:",
    "Benchmark duration (s):",
    "Total input tokens:",
    "Total generated tokens:",
    "Request throughput (req/s):",
    "Output token throughput (tok/s):",
    "Total Token throughput (tok/s):",
    "Mean TTFT (ms):",
    "P99 TPOT (ms):",
    "Median ITL (ms):",
    "Mean E2EL (ms):",
)
KEYS = (
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
    "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts",
    "itls", "errors", "max_concurrency", "request_rate", "burstiness", "num_prompts", "model_id", "date",
    *(f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "std", "p99")),
)


@pytest.fixture(scope="module")
def base_url(tiny_model_dir: Path) -> Iterator[str]:
    with running_server(tiny_model_dir) as server:
        yield server.base_url


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "service", "bench", "serve", "--disable-tqdm", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_random_completions_run_reports_every_request_and_writes_vllms_json(base_url: str, tmp_path: Path) -> None:
    result_path = tmp_path / "out.json"
    run = bench(
        "--base-url", base_url, "--num-prompts", "12", "--max-concurrency", "4", "--random-input-len", "32",
        "--random-output-len", "8", "--ignore-eos", "--result-json", str(result_path),
    )
    assert run.returncode == 0, run.stderr
    for line in HEADLINES:
        assert line in run.stdout
    result = json.loads(result_path.read_text())
    assert set(KEYS) <= set(result)
    assert (result["completed"], result["failed"], result["num_prompts"]) == (12, 0, 12)
    assert result["total_input_tokens"] == 12 * 32
    assert result["total_output_tokens"] == 96
    assert result["output_lens"] == [8] * 12
    assert result["request_throughput"] > 0 and result["output_throughput"] > 0
    assert result["max_concurrency"] == 4 and result["request_rate"] == "inf"
    assert result["model_id"]  # asked of the server's /v1/models
    assert result["mean_ttft_ms"] > 0 and result["mean_tpot_ms"] > 0
    assert result["errors"] == [""] * 12
    # NOTE: the machine the figures came from, and what the engine ran there.
    assert "x86_64" in result["server_version"]["cpu"] or "aarch64" in result["server_version"]["cpu"]
    assert "linears" in result["server_version"]["kernels"]


def test_chat_from_jsonl_with_rate_warmups_and_goodput(base_url: str, tmp_path: Path) -> None:
    dataset = tmp_path / "chat.jsonl"
    dataset.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}) + "\n")
    result_path = tmp_path / "chat.json"
    run = bench(
        "--base-url", base_url + "/v1", "--endpoint", "chat", "--dataset-path", str(dataset), "--num-prompts", "4",
        "--request-rate", "20", "--num-warmups", "2", "--ignore-eos", "--goodput", "e2el:60000",
        "--result-json", str(result_path),
    )
    assert run.returncode == 0, run.stderr
    assert "Warming up with 2 requests" in run.stdout
    assert "Request goodput (req/s):" in run.stdout
    result = json.loads(result_path.read_text())
    assert (result["completed"], result["failed"], result["total_output_tokens"]) == (4, 0, 20)
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])


def test_an_unreachable_server_counts_failed_requests_and_exits_cleanly(tmp_path: Path) -> None:
    result_path = tmp_path / "out.json"
    run = bench(
        "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "m", "--num-prompts", "5",
        "--random-input-len", "16", "--random-output-len", "4", "--result-json", str(result_path),
        "--ready-check-timeout-sec", "0",
    )
    assert run.returncode == 1
    assert "Traceback" not in run.stderr
    assert "every request failed" in run.stderr and "Cannot connect" in run.stderr
    assert "Failed requests:                         5" in run.stdout
    result = json.loads(result_path.read_text())
    assert (result["completed"], result["failed"]) == (0, 5)
    assert all(error.startswith("ClientConnectorError") for error in result["errors"])


def test_it_waits_for_the_server_to_answer_and_says_when_it_gave_up() -> None:
    run = bench(
        "--base-url", f"http://127.0.0.1:{free_port()}", "--num-prompts", "1", "--random-input-len", "4",
        "--ready-check-timeout-sec", "1.5",
    )
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert "Waiting up to 1.5 s for the server" in run.stdout
    assert "did not answer in 1.5 s" in run.stderr


def test_bad_arguments_are_an_error_message_not_a_traceback() -> None:
    run = bench("--goodput", "itl:5")
    assert run.returncode == 2
    assert "Traceback" not in run.stderr and "--goodput" in run.stderr


def prefix_cache_hits(base_url: str) -> float:
    metrics = httpx.get(f"{base_url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith("zeroserve:prefix_cache_hits_total"))


def test_warmups_use_prompts_of_their_own_so_none_is_measured_from_the_prefix_cache(base_url: str) -> None:
    hits_before = prefix_cache_hits(base_url)
    run = bench(
        "--base-url", base_url, "--num-prompts", "4", "--max-concurrency", "1", "--random-input-len", "48",
        "--random-output-len", "2", "--num-warmups", "2", "--seed", "4242",
    )
    assert run.returncode == 0, run.stderr
    # NOTE: a measured prompt repeated from a warm-up would find its first 32 tokens cached.
    assert prefix_cache_hits(base_url) == hits_before


def test_chat_dataset_streams_natural_requests_of_about_the_asked_length(base_url: str, tmp_path: Path) -> None:
    result_path = tmp_path / "chat.json"
    run = bench(
        "--base-url", base_url, "--endpoint", "chat", "--dataset", "chat", "--num-prompts", "4",
        "--random-input-len", "230", "--random-output-len", "4", "--ignore-eos", "--result-json", str(result_path),
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(result_path.read_text())
    assert (result["completed"], result["backend"]) == (4, "openai-chat")
    assert all(170 <= n <= 230 for n in result["input_lens"]) and len(set(result["input_lens"])) > 1
    assert result["output_lens"] == [4] * 4


class _KeyedServer(http.server.BaseHTTPRequestHandler):
    """A server behind a key: every request without `Bearer right` gets a 401."""

    def do_GET(self) -> None:
        self.send_response(200 if self.headers.get("Authorization") == "Bearer right" else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.parametrize("key_args", [(), ("--api-key", "wrong")])
def test_a_server_that_refuses_the_key_ends_the_ready_check_at_once_naming_the_flag(key_args: tuple[str, ...]) -> None:
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeyedServer) as server:
        threading.Thread(target=server.serve_forever, name="keyed-server", daemon=True).start()
        try:
            # NOTE: the default ready check waits 600 s; the run's own timeout (120 s) fails the test first.
            run = bench("--base-url", f"http://127.0.0.1:{server.server_address[1]}", "--num-prompts", "1",
                        "--random-input-len", "4", *key_args)
        finally:
            server.shutdown()
    assert run.returncode == 2 and "Traceback" not in run.stderr
    (line,) = [line for line in run.stderr.splitlines() if "error" in line]
    assert "HTTP 401" in line and "--api-key" in line, line
