"""One prepared run on a CUDA machine: the GPU tests, a served stream, and the benchmark against
transformers on the same GPU, each phase bounded in time, everything written to OUT_DIR.

    python -m benchmarks.gpu_check OUT_DIR [--budget-s 420]

Phases, in order (a phase that fails is logged and the next one runs):
  1. machine.txt: the GPU, torch and CUDA versions.
  2. test_cuda.log: pytest tests/engine_proc/test_cuda.py (fidelity against transformers on the
     GPU, the KV budget from free GPU memory, batching).
  3. serve.json / serve.log: `zeroserve serve` with default flags (device auto: the GPU), a
     streamed chat through the OpenAI SDK, a JSON-schema answer, sampled tokens with logprobs;
     /version's device and choices.
  4. reference_compare_cuda.json / bench.log: benchmarks.reference_compare --device cuda, one round.
  5. sdk.log: the real-model OpenAI SDK tests (tests/service/openai/test_openai_sdk.py) on the
     GPU, with what time is left.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path


def run_logged(command: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> int:
    """Runs `command` with its output in `log`; its exit status (124 when it ran out of time)."""
    with log.open("w") as file:
        try:
            return subprocess.run(
                command, stdout=file, stderr=subprocess.STDOUT, timeout=timeout_s, env={**os.environ, **(env or {})},
            ).returncode
        except subprocess.TimeoutExpired:
            file.write(f"\n[gpu_check: stopped after {timeout_s:.0f} s]\n")
            return 124


def machine(out: Path) -> None:
    import torch

    lines = [subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout]
    lines.append(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
                 f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}")
    (out / "machine.txt").write_text("\n".join(lines))


def serve_and_stream(out: Path) -> None:
    import httpx
    from openai import OpenAI

    from service.bench.local_server import local_server

    record: dict[str, object] = {}
    started = time.perf_counter()
    with local_server([], log_file=out / "serve.log", timeout_s=240) as server:
        record["ready_s"] = time.perf_counter() - started
        record["version"] = httpx.get(f"{server.base_url}/version").json()
        client = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", timeout=60, max_retries=0)
        model = client.models.list().data[0].id
        started = time.perf_counter()
        first_s, text, num_chunks = None, "", 0
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=64, temperature=0, stream=True,
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first_s = first_s or time.perf_counter() - started
                text += chunk.choices[0].delta.content
                num_chunks += 1
        record["stream"] = {"text": text, "num_chunks": num_chunks, "ttft_s": first_s,
                            "total_s": time.perf_counter() - started}
        schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                  "required": ["city"], "additionalProperties": False}
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name the capital of France as JSON with key city."}],
            max_tokens=40, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        )
        record["json_schema"] = answer.choices[0].message.content
        sampled = client.completions.create(
            model=model, prompt="The sea is", max_tokens=8, temperature=0.8, seed=3, logprobs=2,
        )
        logprobs = sampled.choices[0].logprobs
        record["sampled"] = {"text": sampled.choices[0].text, "top_logprobs": logprobs and logprobs.top_logprobs}
        metrics = httpx.get(f"{server.base_url}/metrics").text
        record["metrics"] = [line for line in metrics.splitlines() if "cache" in line and not line.startswith("#")][:10]
    (out / "serve.json").write_text(json.dumps(record, indent=2, default=str))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cuda", help="the benchmark's device (cpu: a dry run here)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="the whole run's time (default: %(default)s)")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + float(args.budget_s)

    def left(most: float) -> float:
        return max(10.0, min(most, deadline - time.monotonic()))

    phases: list[tuple[str, Callable[[], object]]] = []

    # NOTE: only the plugin the suite needs: a GPU image's own pytest plugins may not load beside ours.
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "pytest_asyncio.plugin", "-rA", "-q"]
    no_autoload = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    phases += [
        ("machine", lambda: machine(out)),
        ("test_cuda", lambda: print("rc", run_logged(
            [*pytest, "-s", "tests/engine_proc/test_cuda.py"], out / "test_cuda.log", left(200), no_autoload))),
        ("serve", lambda: serve_and_stream(out)),
        ("bench", lambda: print("rc", run_logged([
            sys.executable, "-m", "benchmarks.reference_compare", "--device", args.device, "--rounds", "1",
            "--concurrency", "1", "16", "64", "--result-json", str(out / "reference_compare_cuda.json"),
        ], out / "bench.log", left(240)))),
        ("sdk", lambda: print("rc", run_logged(
            [*pytest, "tests/service/openai/test_openai_sdk.py"], out / "sdk.log", left(600), no_autoload))),
    ]
    for name, phase in phases:
        if deadline - time.monotonic() < 20:
            print(f"{name}: skipped, out of time", flush=True)
            continue
        started = time.monotonic()
        print(f"{name}: started", flush=True)
        try:
            phase()
        except Exception:  # noqa: BLE001 (a failed phase is logged; the next one still runs)
            traceback.print_exc()
        print(f"{name}: {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
