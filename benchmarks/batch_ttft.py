"""Interactive time to first token while a batch runs (the Batch API), against the same server idle.

    .venv/bin/python -m benchmarks.batch_ttft
    .venv/bin/python -m benchmarks.batch_ttft --num-lines 200 --output-len 64 --num-probes 20
    .venv/bin/python -m benchmarks.batch_ttft -- --max-batch-lines 4   # more `zeroserve serve` flags

Starts `zeroserve serve` (the default model unless `--model`, its store in a temporary folder),
sends `--num-probes` streamed chat requests one after another and times each one's first content
token (idle). It then submits a batch of `--num-lines` chat lines of `--output-len` tokens (EOS
ignored) through OpenAI's SDK and, while the batch is in progress, sends the same probes again
(loaded). Prints (and with `--out` writes) both medians, their ratio (issue #43 asks for at most 1.5),
and how many batch lines were answered meanwhile; then cancels the batch (`--wait`: lets it finish).
The probes of the loaded round that ran after the batch finished are not counted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from service.bench.local_server import local_server

PROBE = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 8, "stream": True}


def first_token_s(client: httpx.Client) -> float:
    """Seconds from sending a streamed chat request to its first content delta."""
    started = time.perf_counter()
    with client.stream("POST", "/v1/chat/completions", json=PROBE) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[len("data: "):])["choices"][0]["delta"]
            if delta.get("content"):
                return time.perf_counter() - started
    raise RuntimeError("the probe's stream ended without content")


def batch_lines(num_lines: int, output_len: int) -> bytes:
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": f"Tell me a story about the number {i}."}],
                  "max_tokens": output_len, "ignore_eos": True}}
        for i in range(num_lines)
    ]
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    serve_args = [args.model, "--responses-store", str(tmp / "store.sqlite"), *args.serve_args]
    with local_server(serve_args, log_file=args.log) as server:
        client = httpx.Client(base_url=server.base_url, timeout=600)
        sdk = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        first_token_s(client)  # NOTE: warm-up (the first request pays for one-time setup).
        idle = [first_token_s(client) for _ in range(args.num_probes)]
        file = sdk.files.create(file=("batch.jsonl", batch_lines(args.num_lines, args.output_len)), purpose="batch")
        batch = sdk.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        while sdk.batches.retrieve(batch.id).status == "validating":
            time.sleep(0.1)
        loaded = []
        for _ in range(args.num_probes):
            ttft = first_token_s(client)
            if sdk.batches.retrieve(batch.id).status != "in_progress":
                break
            loaded.append(ttft)
        during = sdk.batches.retrieve(batch.id).request_counts
        if args.wait:
            while sdk.batches.retrieve(batch.id).status not in ("completed", "failed", "cancelled"):
                time.sleep(0.5)
        elif sdk.batches.retrieve(batch.id).status == "in_progress":
            sdk.batches.cancel(batch.id)
        done = sdk.batches.retrieve(batch.id)
    if not loaded:
        raise RuntimeError("the batch finished before a probe ran beside it: raise --num-lines or --output-len")
    idle_ms, loaded_ms = statistics.median(idle) * 1000, statistics.median(loaded) * 1000
    return {
        "model": args.model, "num_lines": args.num_lines, "output_len": args.output_len,
        "idle_ttft_ms_median": round(idle_ms, 1), "loaded_ttft_ms_median": round(loaded_ms, 1),
        "ratio": round(loaded_ms / idle_ms, 2), "num_loaded_probes": len(loaded),
        "lines_answered_during_probes": during.completed if during else None,
        "batch_status": done.status, "batch_counts": done.request_counts.model_dump() if done.request_counts else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--num-lines", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-probes", type=int, default=20)
    parser.add_argument("--wait", action="store_true", help="let the batch finish (default: cancel it after the probes)")
    parser.add_argument("--log", type=Path, default=None, help="the server's output (default: this terminal)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report here (JSON)")
    parser.add_argument("serve_args", nargs=argparse.REMAINDER, help="more `zeroserve serve` flags, after --")
    args = parser.parse_args()
    args.serve_args = [arg for arg in args.serve_args if arg != "--"]
    with tempfile.TemporaryDirectory(prefix="zeroserve-batch-ttft-") as tmp:
        report = run(args, Path(tmp))
    print(json.dumps(report, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
