"""How many streamed tokens a second one gateway process delivers, the model's cost taken away.

    .venv/bin/python -m benchmarks.serving_path
    .venv/bin/python -m benchmarks.serving_path --concurrency 256 --num-prompts 768 --num-threads 1

Starts `zeroserve serve` with random weights (`--load-format dummy`) shrunk by
`--hf-overrides` to one layer of width 64 (the vocabulary stays the tokenizer's, so
detokenizing is real), one API server process, then drives it with `zeroserve bench serve`
at `--concurrency` streams of `--output-len` tokens, EOS ignored. Prints bench serve's
output tokens/s and, from its per-request chunk timings, how many SSE events carried those
tokens: under load a request's collector merges the deltas its stream has not taken yet
(as vLLM's does), so an event can carry more than one token.

`--num-threads 1` (the default here) leaves the second core to the gateway and the load
generator: measured on 2 cores, an engine with both cores' threads spins against them.

`--beside REF` (a commit, branch or tag) runs the same load on that commit's gateway too (a git worktree
of it, made and removed here), the two taken in turns for `--rounds` rounds (each going first in every
other round), and prints this checkout's
tokens/s over REF's, round by round and for the medians: a regression shows as a ratio below 1 whatever
the machine's speed that day. Each run also says how much CPU the gateway process spent for a thousand
tokens (from /proc, where there is one): with the engine on one thread the engine sets the token rate, so
the gateway's own cost shows there first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from service.bench.local_server import local_server

DUMMY_OVERRIDES = {
    "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
    "intermediate_size": 128,
}


def run(args: argparse.Namespace, tmp: Path, tree: Path | None = None) -> dict[str, Any]:
    """bench serve's result against the gateway of this checkout, or of the checkout at `tree`."""
    serve_args = [
        "--load-format", "dummy", "--hf-overrides", json.dumps(DUMMY_OVERRIDES), "--num-threads", str(args.num_threads),
        "--max-num-seqs", str(args.concurrency), "--max-num-batched-tokens", "8192",
    ]
    result_path = tmp / "serving-path.json"
    with local_server(serve_args, log_file=Path(os.devnull), cwd=tree) as server:
        cpu_before = cpu_seconds(server.proc.pid)
        subprocess.run([
            sys.executable, "-m", "service", "bench", "serve", "--base-url", server.base_url,
            "--endpoint", "completions", "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.concurrency), "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--ignore-eos", "--num-warmups", "16",
            "--result-json", str(result_path), "--disable-tqdm",
        ], check=True)
        cpu_after = cpu_seconds(server.proc.pid)
    result: dict[str, Any] = json.loads(result_path.read_text())
    if cpu_before is not None and cpu_after is not None:
        # NOTE: warmups included; the engine's own process is not counted.
        result["gateway_cpu_ms_per_1k_tokens"] = 1e6 * (cpu_after - cpu_before) / result["total_output_tokens"]
    return result


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) a process has used so far, from /proc (None where there is none)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A detached git worktree of `ref`, removed afterwards."""
    with tempfile.TemporaryDirectory() as parent:
        path = Path(parent) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(path), ref], check=True)
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], check=False)


def describe(result: dict[str, Any], concurrency: int) -> tuple[str, float, float]:
    """A line of a run's figures, its SSE events a second and tokens an event."""
    # NOTE: a request's events are its text chunks: the first, then one per inter-token gap.
    num_events = sum(len(itl) + 1 for itl, length in zip(result["itls"], result["output_lens"], strict=False) if length)
    events_per_s = num_events / result["duration"]
    tokens_per_event = result["total_output_tokens"] / num_events if num_events else 0.0
    line = (f"serving path, {concurrency} streams: {result['output_throughput']:.0f} output tok/s, "
            f"{events_per_s:.0f} SSE events/s ({tokens_per_event:.2f} tokens an event), "
            f"ITL p50 {result['median_itl_ms']:.1f} ms, failed {result['failed']}")
    return line, events_per_s, tokens_per_event


def beside(args: argparse.Namespace) -> None:
    """This checkout and `args.beside` in turns; prints each round's tokens/s and their ratio."""
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    with worktree(args.beside) as tree, tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            # NOTE: the two take turns going first (ABBA...), so a drift over the run favours neither.
            turns = [(ours, None), (theirs, tree)]
            for results, where in turns if index % 2 == 0 else reversed(turns):
                results.append(run(args, Path(tmp), where))
            print(f"round {index + 1}: this checkout {_figures(ours[-1])}, {args.beside} {_figures(theirs[-1])}, "
                  f"{ours[-1]['output_throughput'] / theirs[-1]['output_throughput']:.2f}x", flush=True)
    medians = [statistics.median(r["output_throughput"] for r in results) for results in (ours, theirs)]
    ratio = medians[0] / medians[1]
    print(f"medians: this checkout {medians[0]:.0f} tok/s, {args.beside} {medians[1]:.0f} tok/s: {ratio:.3f}x")
    cpu = [[r["gateway_cpu_ms_per_1k_tokens"] for r in results if "gateway_cpu_ms_per_1k_tokens" in r]
           for results in (ours, theirs)]
    if all(cpu):
        print(f"gateway CPU a thousand tokens, medians: this checkout {statistics.median(cpu[0]):.1f} ms, {args.beside} "
              f"{statistics.median(cpu[1]):.1f} ms")
    args.result_json.write_text(json.dumps({
        "beside": args.beside, "this_checkout": [_kept(r) for r in ours], "beside_runs": [_kept(r) for r in theirs],
        "ratio_of_medians": ratio, "settings": {key: str(value) for key, value in vars(args).items()},
    }, indent=2))


def _kept(result: dict[str, Any]) -> dict[str, Any]:
    return {key: result[key] for key in ("output_throughput", "gateway_cpu_ms_per_1k_tokens") if key in result}


def _figures(result: dict[str, Any]) -> str:
    cpu = result.get("gateway_cpu_ms_per_1k_tokens")
    return f"{result['output_throughput']:.0f} tok/s" + ("" if cpu is None else f" (gateway {cpu:.0f} ms CPU / 1k tokens)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--num-prompts", type=int, default=768)
    parser.add_argument("--input-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--num-threads", type=int, default=1, help="the engine's torch threads")
    parser.add_argument("--beside", metavar="REF", help="also run the gateway of this git commit, in turns")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the two with --beside")
    parser.add_argument("--result-json", type=Path, default=Path("serving_path.json"))
    args = parser.parse_args()
    if args.beside:
        beside(args)
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args, Path(tmp))
    line, events_per_s, tokens_per_event = describe(result, args.concurrency)
    print(line)
    args.result_json.write_text(json.dumps({
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "output_throughput": result["output_throughput"], "events_per_s": events_per_s,
        "tokens_per_event": tokens_per_event, "median_itl_ms": result["median_itl_ms"],
        "p99_itl_ms": result["p99_itl_ms"], "failed": result["failed"],
        "settings": {key: str(value) for key, value in vars(args).items()},
    }, indent=2))


if __name__ == "__main__":
    main()
