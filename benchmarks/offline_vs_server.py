"""Offline `LLM.generate` against the HTTP server, same model, same prompts, same concurrency.

    .venv/bin/python -m benchmarks.offline_vs_server                 # 16 and 64 at once
    .venv/bin/python -m benchmarks.offline_vs_server --concurrency 16 --num-prompts 64

For each concurrency C: a server with `--max-num-seqs C` is started and `zeroserve bench serve
--max-concurrency C` streams the prompts at it; then `zeroserve bench throughput --max-num-seqs C`
runs the same prompts (same random dataset and seed) through `LLM.generate`. Both run every
request to its max_tokens (`ignore_eos`). Output tokens/s of each, and their ratio, are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from service.bench.local_server import local_server


def run(command: list[str]) -> None:
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def serve_figures(args: argparse.Namespace, concurrency: int, result_path: Path) -> dict[str, float]:
    serve_args = [
        args.model, "--dtype", args.dtype, "--kv-cache-memory", "1",
        "--max-num-seqs", str(concurrency), "--num-threads", str(args.num_threads),
    ]
    with local_server(serve_args, log_file=Path(os.devnull)) as server:
        run([
            sys.executable, "-m", "service", "bench", "serve", "--base-url", server.base_url,
            "--num-prompts", str(args.num_prompts), "--max-concurrency", str(concurrency),
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--ignore-eos", "--num-warmups", "2", "--result-json", str(result_path), "--disable-tqdm",
        ])
    result: dict[str, float] = json.loads(result_path.read_text())
    return result


def offline_figures(args: argparse.Namespace, concurrency: int, result_path: Path) -> dict[str, float]:
    run([
        sys.executable, "-m", "service", "bench", "throughput", args.model, "--dtype", args.dtype,
        "--kv-cache-memory", "1",
        "--max-num-seqs", str(concurrency), "--num-threads", str(args.num_threads),
        "--num-prompts", str(args.num_prompts), "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--num-warmups", "2", "--output-json", str(result_path),
        "--disable-tqdm",
    ])
    result: dict[str, float] = json.loads(result_path.read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--num-prompts", type=int, default=None, help="default: 4 × concurrency")
    parser.add_argument("--input-len", type=int, default=230)
    parser.add_argument("--output-len", type=int, default=128)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for concurrency in args.concurrency:
            num_prompts = args.num_prompts or 4 * concurrency
            run_args = argparse.Namespace(**{**vars(args), "num_prompts": num_prompts})
            served = serve_figures(run_args, concurrency, Path(tmp) / f"serve-{concurrency}.json")
            offline = offline_figures(run_args, concurrency, Path(tmp) / f"offline-{concurrency}.json")
            rows.append((concurrency, num_prompts, served["output_throughput"], offline["output_throughput"]))
            print(f"concurrency {concurrency}: HTTP {served['output_throughput']:.1f} tok/s, "
                  f"LLM.generate {offline['output_throughput']:.1f} tok/s", flush=True)
    print(f"{'concurrency':>11} {'prompts':>7} {'HTTP tok/s':>10} {'LLM.generate tok/s':>18} {'ratio':>6}")
    for concurrency, num_prompts, served_tps, offline_tps in rows:
        print(f"{concurrency:>11} {num_prompts:>7} {served_tps:>10.1f} {offline_tps:>18.1f} {offline_tps / served_tps:>6.2f}")


if __name__ == "__main__":
    main()
