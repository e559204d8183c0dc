"""`zeroserve bench throughput` on a tiny model: every prompt runs, figures add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_reports_and_writes_vllm_keys(tiny_model_dir: Path, tmp_path: Path) -> None:
    result_path = tmp_path / "result.json"
    command = [
        sys.executable, "-m", "service", "bench", "throughput", str(tiny_model_dir), "--num-prompts", "8",
        "--random-input-len", "16", "--random-output-len", "4", "--num-warmups", "2", "--num-threads", "1",
        "--kv-cache-memory", "0.05", "--max-model-len", "1024", "--output-json", str(result_path),
        "--disable-tqdm",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Throughput:" in done.stdout and "output tokens/s" in done.stdout
    result = json.loads(result_path.read_text())
    assert result["num_requests"] == 8
    assert result["total_input_tokens"] == 8 * 16
    assert result["total_output_tokens"] == 8 * 4
    assert result["total_num_tokens"] == 8 * 20
    assert result["requests_per_second"] > 0 and result["tokens_per_second"] > result["output_throughput"] > 0


def test_engine_flags_reach_the_engine_whole(tiny_model_dir: Path, tmp_path: Path) -> None:
    # NOTE: random weights with a context overridden to 32 tokens: 64-token prompts must be refused.
    command = [
        sys.executable, "-m", "service", "bench", "throughput", str(tiny_model_dir), "--num-prompts", "2",
        "--random-input-len", "64", "--random-output-len", "4", "--num-threads", "1",
        "--kv-cache-memory", "0.05", "--load-format", "dummy", "--hf-overrides", '{"max_position_embeddings": 32}',
        "--disable-tqdm",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "maximum context length is 32 tokens" in done.stderr and "Traceback" not in done.stderr
