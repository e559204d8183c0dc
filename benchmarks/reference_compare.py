"""zeroserve's HTTP server against transformers `generate`, same GGUF, same machine, one run.

    .venv/bin/python -m benchmarks.reference_compare
    .venv/bin/python -m benchmarks.reference_compare --dtype float32 --rounds 1 --result-json fp32.json
    python -m benchmarks.reference_compare --device cuda     # both sides on the GPU

(a) transformers (float32, as it loads a GGUF; bfloat16 on a GPU, as zeroserve runs there): sequential greedy `generate` of one prompt
(decode tokens/s, its prefill excluded) and a static batch of 16 prompts, left-padded (output
tokens/s, its prefill included). (b) `zeroserve serve` with its default engine flags (or
`--dtype`), driven by `zeroserve bench serve` with streamed chat requests at each
`--concurrency`, and (c) optionally a second server with n-gram speculative decoding
(`--speculative-config`, greedy outputs unchanged). Prompts are natural chat requests of about
230 tokens once templated, each distinct (service/bench/chat_prompts.py; `--prompts random` for
random tokens, which the model continues in loops that flatter n-gram drafts); 128 tokens come
out of each, greedy, EOS ignored. The result names the CPU, torch's capability and what the
engine chose to run each piece of a step on (its /version).

Both servers stay up while the run measures (a), (b) and (c) in turn, `--rounds` times
over: each round's ratios compare figures taken minutes apart, so a slow spell of a shared
machine weighs on both sides of a ratio. Prints each round's ratios, then the medians over
rounds of every figure and ratio, and writes them all to `--result-json`.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import torch

from engine_proc.cpu.features import cpu_model_name
from service.bench.chat_prompts import chat_prompts
from service.bench.local_server import local_server
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model
from service.model_files.tokenizer import Tokenizer

# Goals of issue 6: (figure, comparison, threshold).
TARGETS = {
    "throughput_16_vs_transformers_batch16": (">=", 4.0),
    "single_stream_decode_vs_transformers_sequential": (">=", 5.0),
    "ttft_p50_at_16_s": ("<", 2.0),
    "throughput_64_over_16": (">", 1.0),
    "itl_p99_over_p50_at_64": ("<", 4.0),
}


# The second configuration: n-gram drafts, up to 7 a step (a request's number of drafts
# follows how many it has had accepted; 3, 7, 11 and 15 measured in process at 16 streams:
# 7 was 26% ahead of 3, more gained nothing measurable).
SPECULATIVE_CONFIG = '{"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 4}'


def reference_dtype(device: str) -> torch.dtype:
    """transformers' dtype: float32 on the CPU (exact, as it loads a GGUF), bfloat16 on a GPU."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def load_transformers(args: argparse.Namespace) -> Any:
    import transformers

    torch.set_num_threads(args.num_threads)
    path = resolve_model(args.model).path
    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=reference_dtype(args.device)
    ).to(args.device).eval()


def reference_prompts(args: argparse.Namespace, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """16 prompts as token ids, left-padded, and their attention mask: the servers' kind of prompt."""
    tokenizer = Tokenizer.from_model(resolve_model(args.model).path)
    if args.prompts == "random":
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(100, 40000, (16, args.input_len), generator=generator)
        return ids, torch.ones_like(ids)
    rows = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}]), add_special_tokens=True)
        for text in chat_prompts(tokenizer, 16, args.input_len, seed)
    ]
    width = max(len(row) for row in rows)
    ids = torch.tensor([[0] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return ids, mask


def transformers_figures(model: Any, args: argparse.Namespace, round_index: int) -> dict[str, float]:
    prompts, mask = (t.to(args.device) for t in reference_prompts(args, seed=round_index))

    def generate(rows: slice, num_tokens: int) -> float:
        batch, batch_mask = prompts[rows], mask[rows]
        # NOTE: a lone prompt without its padding, as a single request would come.
        if batch.shape[0] == 1:
            batch = batch[:, int((batch_mask == 0).sum()):]
            batch_mask = torch.ones_like(batch)
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                batch, attention_mask=batch_mask, max_new_tokens=num_tokens,
                min_new_tokens=num_tokens, do_sample=False, pad_token_id=0,
            )
        assert out.shape[1] == batch.shape[1] + num_tokens
        if out.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - started

    generate(slice(0, 1), 4)  # warm-up
    prefill_s = min(generate(slice(0, 1), 1) for _ in range(2))
    sequential_s = generate(slice(0, 1), args.output_len)
    batch_s = generate(slice(0, 16), args.output_len)
    gc.collect()
    return {
        "sequential_decode_tok_s": (args.output_len - 1) / (sequential_s - prefill_s),
        "sequential_s": sequential_s,
        "prefill_s": prefill_s,
        "batch16_output_tok_s": 16 * args.output_len / batch_s,
        "batch16_s": batch_s,
    }


def machine_record(base_url: str) -> dict[str, Any]:
    """The CPU, torch's capability and the engine's choices, as the server reports them."""
    version = httpx.get(f"{base_url}/version", timeout=10).json()
    return {"cpu": version.get("cpu", cpu_model_name()), "kernels": version.get("kernels", {}),
            "torch": torch.__version__, "num_cpus": os.cpu_count()}


def serve_args(args: argparse.Namespace, extra_args: list[str]) -> list[str]:
    serve = [args.model, "--num-threads", str(args.num_threads), "--max-num-seqs", str(max(args.concurrency)),
             "--device", args.device]
    if args.dtype:
        serve += ["--dtype", args.dtype]
    return serve + extra_args


def zeroserve_figures(args: argparse.Namespace, tmp: Path, base_url: str, round_index: int) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for concurrency in args.concurrency:
        result_path = tmp / f"serve-{concurrency}.json"
        num_prompts = 4 if concurrency == 1 else 2 * concurrency
        # NOTE: prompts never seen before by this server (a seed per round and concurrency), so
        # no prompt is served from the prefix cache: transformers has none to match it.
        seed = 1000 * round_index + concurrency
        subprocess.run([
            sys.executable, "-m", "service", "bench", "serve", "--base-url", base_url,
            "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
            "--dataset", args.prompts, "--endpoint", "chat" if args.prompts == "chat" else "completions",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--ignore-eos", "--num-warmups", "2", "--seed", str(seed),
            "--result-json", str(result_path), "--disable-tqdm",
        ], check=True, stdout=subprocess.DEVNULL)
        results[str(concurrency)] = json.loads(result_path.read_text())
    return results


def ratios(reference: dict[str, float], served: dict[str, dict[str, Any]]) -> dict[str, float]:
    figures: dict[str, float] = {}
    if "16" in served:
        figures["throughput_16_vs_transformers_batch16"] = (
            served["16"]["output_throughput"] / reference["batch16_output_tok_s"]
        )
        figures["ttft_p50_at_16_s"] = served["16"]["median_ttft_ms"] / 1000
    if "1" in served:
        figures["single_stream_decode_vs_transformers_sequential"] = (
            1000 / served["1"]["median_tpot_ms"] / reference["sequential_decode_tok_s"]
        )
    if "16" in served and "64" in served:
        figures["throughput_64_over_16"] = served["64"]["output_throughput"] / served["16"]["output_throughput"]
    if "64" in served:
        figures["itl_p99_over_p50_at_64"] = served["64"]["p99_itl_ms"] / served["64"]["median_itl_ms"]
    return figures


_REPORTED = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms")


def medians(rounds: list[dict[str, Any]], name: str) -> dict[str, dict[str, float]]:
    """Each reported figure of server configuration `name`, per concurrency, as its median over rounds."""
    served = [round_["zeroserve"][name] for round_ in rounds]
    return {
        concurrency: {key: statistics.median(result[concurrency][key] for result in served) for key in _REPORTED}
        for concurrency in served[0]
    }


def is_met(name: str, value: float) -> bool:
    comparison, threshold = TARGETS[name]
    return value >= threshold if comparison == ">=" else value > threshold if comparison == ">" else value < threshold


def print_report(name: str, served: dict[str, dict[str, float]], per_round: list[dict[str, float]]) -> dict[str, float]:
    """Prints a configuration's median figures and ratios (each round's in brackets); returns the median ratios."""
    print(f"zeroserve, {name} (medians over {len(per_round)} rounds):")
    print(f"{'streams':>7} {'out tok/s':>9} {'TTFT p50 ms':>11} {'TPOT p50 ms':>11} {'ITL p50 ms':>10} {'ITL p99 ms':>10}")
    for concurrency, result in served.items():
        print(f"{concurrency:>7} {result['output_throughput']:>9.1f} {result['median_ttft_ms']:>11.0f} "
              f"{result['median_tpot_ms']:>11.1f} {result['median_itl_ms']:>10.1f} {result['p99_itl_ms']:>10.1f}")
    figures = {key: statistics.median(ratios_[key] for ratios_ in per_round) for key in per_round[0]}
    for key, value in figures.items():
        comparison, threshold = TARGETS[key]
        each = ", ".join(f"{ratios_[key]:.2f}" for ratios_ in per_round)
        print(f"{key:<50} {value:8.2f}  [{each}]  target {comparison} {threshold}: "
              f"{'met' if is_met(key, value) else 'MISSED'}")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default=None, help="the servers' --dtype (default: the server's default)")
    parser.add_argument("--device", default="cpu", help="where both sides run: cpu, cuda (default: %(default)s)")
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--input-len", type=int, default=230)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="measure every side this many times, interleaved")
    parser.add_argument("--prompts", choices=["chat", "random"], default="chat", help="(default: %(default)s)")
    parser.add_argument(
        "--speculative-config", default="",
        help=f"also run a second server with this --speculative-config (e.g. '{SPECULATIVE_CONFIG}')",
    )
    parser.add_argument("--result-json", type=Path, default=Path("reference_compare.json"))
    args = parser.parse_args()
    if importlib.util.find_spec("transformers") is None:
        parser.error("transformers is not installed: .venv/bin/pip install -e '.[bench]' (make test installs it too)")
    load_before = os.getloadavg()
    model = load_transformers(args)
    configs: dict[str, list[str]] = {"default flags": []}
    if args.speculative_config:
        configs["--speculative-config " + args.speculative_config] = ["--speculative-config", args.speculative_config]
    rounds: list[dict[str, Any]] = []
    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        # NOTE: both servers up for the whole run; an idle one waits on its queue and takes no CPU.
        base_urls = {
            name: stack.enter_context(local_server(serve_args(args, extra), log_file=Path(os.devnull))).base_url
            for name, extra in configs.items()
        }
        machine = machine_record(next(iter(base_urls.values())))
        print(f"device: {machine['cpu']}; engine: {machine['kernels']}", flush=True)
        for index in range(args.rounds):
            reference = transformers_figures(model, args, index)
            served = {name: zeroserve_figures(args, Path(tmp), base_url, index) for name, base_url in base_urls.items()}
            round_ratios = {name: ratios(reference, served[name]) for name in configs}
            rounds.append({"transformers": reference, "zeroserve": served, "ratios": round_ratios})
            print(f"round {index + 1}: transformers sequential {reference['sequential_decode_tok_s']:.1f} tok/s, "
                  f"batch 16 {reference['batch16_output_tok_s']:.1f}; " + "; ".join(
                      f"{name}: 16 streams {served[name]['16']['output_throughput']:.1f} tok/s"
                      for name in configs if "16" in served[name]), flush=True)
    del model
    reference_medians = {key: statistics.median(round_["transformers"][key] for round_ in rounds) for key in rounds[0]["transformers"]}
    print(f"transformers {str(reference_dtype(args.device)).removeprefix('torch.')} (medians): sequential decode {reference_medians['sequential_decode_tok_s']:.1f} tok/s, "
          f"static batch 16 {reference_medians['batch16_output_tok_s']:.1f} output tok/s")
    summary: dict[str, Any] = {}
    for name in configs:
        served_medians = medians(rounds, name)
        figures = print_report(name, served_medians, [round_["ratios"][name] for round_ in rounds])
        summary[name] = {"zeroserve": served_medians, "ratios": figures}
    args.result_json.write_text(json.dumps({
        "machine": machine, "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "transformers": reference_medians, "medians": summary, "rounds": rounds,
        "settings": {key: str(value) for key, value in vars(args).items()},
    }, indent=2))


if __name__ == "__main__":
    main()
