"""`zeroserve generate`: JSONL in, results in input order, resumable after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto.engine_config import EngineConfig
from service.api.routes import batch_endpoints
from service.frontend.llm_engine import LLMEngine
from service.model_files.tokenizer import Tokenizer
from service.openai.batch_generate import BatchRunner


def write_requests(path: Path, num_lines: int, max_tokens: int) -> list[dict[str, object]]:
    bodies: list[dict[str, object]] = []
    for i in range(num_lines):
        if i % 3 == 0:
            body: dict[str, object] = {
                "messages": [{"role": "user", "content": f"Question {i}?"}], "max_tokens": max_tokens,
                "ignore_eos": True,
            }
        else:
            body = {"prompt": f"Line {i} says", "max_tokens": max_tokens, "ignore_eos": True}
        bodies.append(body)
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies))
    return bodies


def read_results(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[LLMEngine]:
    args = EngineConfig(
        model_path=str(tiny_model_dir), model_name="tiny", kv_cache_memory_gib=0.05, max_model_len=1024,
        num_threads=1,
    )
    engine = LLMEngine(args, Tokenizer.from_model(tiny_model_dir), multiprocess_mode=False)
    yield engine
    engine.shutdown()


def test_results_follow_input_order_with_errors_in_place(engine: LLMEngine, tmp_path: Path) -> None:
    lines = [
        json.dumps({"prompt": "Hello", "max_tokens": 3, "ignore_eos": True, "n": 2}),
        "not json",
        json.dumps({"custom_id": "job-7", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "ignore_eos": True}}),
        json.dumps({"prompt": "x", "max_tokens": 5000}),
        json.dumps({"prompt": ["one", "two"], "max_tokens": 4, "ignore_eos": True}),
        json.dumps({"prompt": "t", "temperature": -1}),
    ]
    input_path, output_path = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    input_path.write_text("\n".join(lines) + "\n")
    assert BatchRunner(engine, "tiny", {}, batch_endpoints(), max_in_flight=2).run(input_path, output_path, use_tqdm=False) == 6
    results = read_results(output_path)
    assert [r["line"] for r in results] == list(range(6))
    statuses = [r["response"] and r["response"]["status_code"] for r in results]  # type: ignore[index]
    assert statuses == [200, None, 200, 400, 200, 400]
    assert results[1]["error"]["code"] == "invalid_json_line"  # type: ignore[index]
    first = results[0]["response"]["body"]  # type: ignore[index]
    assert first["object"] == "text_completion" and [c["index"] for c in first["choices"]] == [0, 1]
    assert first["usage"]["completion_tokens"] == 6
    chat = results[2]
    assert chat["custom_id"] == "job-7"
    assert chat["response"]["body"]["object"] == "chat.completion"  # type: ignore[index]
    # NOTE: OpenAI's shape: a request's error answer is its `response`, `error` is for lines that were no request.
    assert "maximum context length" in results[3]["response"]["body"]["error"]["message"]  # type: ignore[index]
    assert "temperature" in results[5]["response"]["body"]["error"]["message"]  # type: ignore[index]
    assert results[3]["error"] is None and results[5]["error"] is None
    two_prompts = results[4]["response"]["body"]  # type: ignore[index]
    assert [c["index"] for c in two_prompts["choices"]] == [0, 1]
    assert two_prompts["usage"]["completion_tokens"] == 8


def test_a_rerun_skips_what_is_written_and_cuts_a_torn_line(engine: LLMEngine, tmp_path: Path) -> None:
    input_path, output_path = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    write_requests(input_path, 5, max_tokens=2)
    runner = BatchRunner(engine, "tiny", {}, batch_endpoints())
    runner.run(input_path, output_path, use_tqdm=False)
    complete = output_path.read_text().splitlines(keepends=True)
    output_path.write_text("".join(complete[:3]) + complete[3][:10])
    assert runner.run(input_path, output_path, use_tqdm=False) == 2
    assert [r["line"] for r in read_results(output_path)] == [0, 1, 2, 3, 4]


def test_a_killed_run_resumes_to_exactly_one_result_per_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    input_path, output_path = tmp_path / "prompts.jsonl", tmp_path / "results.jsonl"
    write_requests(input_path, 100, max_tokens=24)
    command = [
        sys.executable, "-m", "service", "generate", str(tiny_model_dir), "--input", str(input_path),
        "--output", str(output_path), "--max-num-seqs", "2", "--max-in-flight", "4", "--num-threads", "1",
        "--kv-cache-memory", "0.05", "--max-model-len", "1024", "--disable-tqdm",
    ]
    proc = subprocess.Popen(command)
    try:
        deadline = time.monotonic() + 180
        while not output_path.exists() or output_path.read_bytes().count(b"\n") < 30:
            assert proc.poll() is None, "the batch ended before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    num_written = output_path.read_bytes().count(b"\n")
    assert 30 <= num_written < 100
    assert subprocess.run(command, timeout=300).returncode == 0
    results = read_results(output_path)
    assert [r["line"] for r in results] == list(range(100))
    assert all(r["response"]["status_code"] == 200 for r in results)  # type: ignore[index]
    assert all(r["response"]["body"]["usage"]["completion_tokens"] == 24 for r in results)  # type: ignore[index]
