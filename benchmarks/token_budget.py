"""First tokens under load against the step's token budget: which `--max-num-batched-tokens` to default to.

    .venv/bin/python -m benchmarks.token_budget
    .venv/bin/python -m benchmarks.token_budget --model FILE.gguf --budgets 256 512 1024 --rounds 2

Starts `zeroserve serve` (default flags but the budget) once per budget in `--budgets`, and drives each
with `zeroserve bench serve` in a closed loop: `--concurrency` clients (16), each sending its next
streamed chat request (natural chat text, about 230 tokens once templated, each distinct; 128 tokens
out, greedy, EOS ignored) as soon as its last one ends, `--num-prompts` in all. The rounds take the
budgets in turn, so a slow spell of a shared machine weighs on all. Reports, as medians over rounds:
output tokens/s, TTFT p50 and p99, ITL p50 and p99; then, the server idle, the TTFT of a prompt of
`--long-prompt-len` random tokens (2,000) sent alone. A smaller budget prefills fewer prompt tokens a
step beside the running decodes (a step is quicker, a long wave of arrivals takes more of them); a
larger one prefills a whole wave at once (the decodes wait on it, and the wave's clients stay in step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from engine_proc.cpu.features import cpu_model_name
from service.bench.local_server import local_server
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model

FIGURES = ("output_tok_s", "ttft_p50_s", "ttft_p99_s", "itl_p50_ms", "itl_p99_ms", "long_ttft_s")


def bench(base_url: str, seed: int, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    result_path = tmp / f"bench-{seed}.json"
    # NOTE: prompts never sent before (a seed per round and budget): no prefix-cache hits.
    subprocess.run([
        sys.executable, "-m", "service", "bench", "serve", "--base-url", base_url,
        "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
        "--dataset", "chat", "--endpoint", "chat", "--random-input-len", str(args.input_len),
        "--random-output-len", str(args.output_len), "--ignore-eos", "--num-warmups", "2", "--seed", str(seed),
        "--tokenizer", str(args.model), "--percentile-metrics", "ttft,itl", "--metric-percentiles", "50,99",
        "--result-json", str(result_path), "--disable-tqdm",
    ], check=True, stdout=subprocess.DEVNULL)
    result: dict[str, Any] = json.loads(result_path.read_text())
    if result["completed"] != result["num_prompts"]:
        raise RuntimeError(f"{result['num_prompts'] - result['completed']} requests failed: {result.get('errors')}")
    return {
        "output_tok_s": result["output_throughput"], "ttft_p50_s": result["p50_ttft_ms"] / 1000,
        "ttft_p99_s": result["p99_ttft_ms"] / 1000, "itl_p50_ms": result["p50_itl_ms"], "itl_p99_ms": result["p99_itl_ms"],
    }


def long_prompt_ttft(base_url: str, seed: int, args: argparse.Namespace, tmp: Path) -> float:
    """TTFT p50 of `--long-prompt-len` random tokens sent alone, one after another (a budget's other side:
    a prompt longer than the budget takes that many more steps)."""
    result_path = tmp / f"long-{seed}.json"
    subprocess.run([
        sys.executable, "-m", "service", "bench", "serve", "--base-url", base_url, "--num-prompts", "3",
        "--max-concurrency", "1", "--dataset", "random", "--endpoint", "completions",
        "--random-input-len", str(args.long_prompt_len), "--random-output-len", "4", "--ignore-eos",
        "--num-warmups", "0", "--seed", str(seed), "--tokenizer", str(args.model), "--result-json", str(result_path),
        "--disable-tqdm",
    ], check=True, stdout=subprocess.DEVNULL)
    return float(json.loads(result_path.read_text())["median_ttft_ms"]) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF file (default: the default model's)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=230)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--long-prompt-len", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--result-json", type=Path, default=None)
    args = parser.parse_args()
    args.model = args.model or resolve_model(DEFAULT_MODEL).path
    rounds: list[dict[int, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        for round_index in range(args.rounds):
            figures: dict[int, dict[str, float]] = {}
            for budget_index, budget in enumerate(args.budgets):
                serve = [str(args.model), "--num-threads", str(args.threads), "--max-num-batched-tokens", str(budget)]
                with local_server(serve, log_file=tmp / f"serve-{budget}.log") as server:
                    seed = 1000 * round_index + budget_index
                    figures[budget] = bench(server.base_url, seed, args, tmp)
                    figures[budget]["long_ttft_s"] = long_prompt_ttft(server.base_url, seed, args, tmp)
                print(f"round {round_index + 1}, budget {budget}: " + ", ".join(
                    f"{name} {value:.2f}" for name, value in figures[budget].items()
                ), flush=True)
            rounds.append(figures)
    medians = {
        budget: {name: statistics.median(figures[budget][name] for figures in rounds) for name in FIGURES}
        for budget in args.budgets
    }
    print(f"\n{cpu_model_name()}; {args.model.name}; {args.concurrency} clients in a closed loop, {args.num_prompts} requests")
    long_header = f"TTFT {args.long_prompt_len} alone"
    print(f"{'budget':>8} {'output tok/s':>13} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {long_header:>16}")
    for budget, row in medians.items():
        print(
            f"{budget:>8} {row['output_tok_s']:>13.1f} {row['ttft_p50_s']:>8.2f}s {row['ttft_p99_s']:>8.2f}s "
            f"{row['itl_p50_ms']:>6.0f}ms {row['itl_p99_ms']:>6.0f}ms {row['long_ttft_s']:>15.2f}s"
        )
    if args.result_json is not None:
        args.result_json.write_text(json.dumps({"cpu": cpu_model_name(), "model": str(args.model), "medians": medians,
                                                "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
