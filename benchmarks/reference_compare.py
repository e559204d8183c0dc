"""zeroserve's HTTP server against transformers `generate`, same GGUF, same machine, one run.

    .venv/bin/python -m benchmarks.reference_compare
    .venv/bin/python -m benchmarks.reference_compare --dtype float32 --result-json fp32.json

(a) transformers (float32, as it loads a GGUF): sequential greedy `generate` of one prompt
(decode tokens/s, its prefill excluded) and a static batch of 16 prompts (output tokens/s,
its prefill included). (b) `zeroserve serve` with its default engine flags (or `--dtype`),
driven by `zeroserve bench serve` at each `--concurrency`, and again with n-gram
speculative decoding (`--speculative-config`, greedy outputs unchanged). Prompts are ≈230
random tokens, 128 tokens come out of each, EOS ignored. Prints a table and the target
ratios per server configuration, and writes them all to `--result-json`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.local_server import local_server
from service.model_registry import DEFAULT_MODEL, resolve_model

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


def transformers_figures(args: argparse.Namespace) -> dict[str, float]:
    import transformers

    torch.set_num_threads(args.num_threads)
    path = resolve_model(args.model).path
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(100, 40000, (16, args.input_len), generator=generator)

    def generate(batch: torch.Tensor, num_tokens: int) -> float:
        started = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                batch, attention_mask=torch.ones_like(batch), max_new_tokens=num_tokens,
                min_new_tokens=num_tokens, do_sample=False, pad_token_id=0,
            )
        assert out.shape[1] == batch.shape[1] + num_tokens
        return time.perf_counter() - started

    generate(prompts[:1], 4)  # warm-up
    prefill_s = min(generate(prompts[:1], 1) for _ in range(2))
    sequential_s = generate(prompts[:1], args.output_len)
    batch_s = generate(prompts, args.output_len)
    del model
    gc.collect()
    return {
        "sequential_decode_tok_s": (args.output_len - 1) / (sequential_s - prefill_s),
        "sequential_s": sequential_s,
        "prefill_s": prefill_s,
        "batch16_output_tok_s": 16 * args.output_len / batch_s,
        "batch16_s": batch_s,
    }


def zeroserve_figures(args: argparse.Namespace, tmp: Path, extra_args: list[str]) -> dict[str, dict[str, Any]]:
    serve_args = [args.model, "--num-threads", str(args.num_threads), "--max-num-seqs", str(max(args.concurrency))]
    if args.dtype:
        serve_args += ["--dtype", args.dtype]
    serve_args += extra_args
    results: dict[str, dict[str, Any]] = {}
    with local_server(serve_args) as base_url:
        for concurrency in args.concurrency:
            result_path = tmp / f"serve-{concurrency}.json"
            num_prompts = 4 if concurrency == 1 else 2 * concurrency
            subprocess.run([
                sys.executable, "-m", "service", "bench", "serve", "--base-url", base_url,
                "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
                "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
                "--ignore-eos", "--num-warmups", "2", "--result-json", str(result_path), "--disable-tqdm",
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


def print_report(name: str, served: dict[str, dict[str, Any]], figures: dict[str, float]) -> None:
    print(f"zeroserve, {name}:")
    print(f"{'streams':>7} {'out tok/s':>9} {'TTFT p50 ms':>11} {'TPOT p50 ms':>11} {'ITL p50 ms':>10} {'ITL p99 ms':>10}")
    for concurrency, result in served.items():
        print(f"{concurrency:>7} {result['output_throughput']:>9.1f} {result['median_ttft_ms']:>11.0f} "
              f"{result['median_tpot_ms']:>11.1f} {result['median_itl_ms']:>10.1f} {result['p99_itl_ms']:>10.1f}")
    for name, value in figures.items():
        comparison, threshold = TARGETS[name]
        is_met = value >= threshold if comparison == ">=" else value > threshold if comparison == ">" else value < threshold
        print(f"{name:<50} {value:8.2f}  target {comparison} {threshold}: {'met' if is_met else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default=None, help="the server's --dtype (default: the server's default)")
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--input-len", type=int, default=230)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument(
        "--speculative-config", default=SPECULATIVE_CONFIG,
        help="the second server configuration's --speculative-config ('' to run the default one only)",
    )
    parser.add_argument("--result-json", type=Path, default=Path("reference_compare.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    reference = transformers_figures(args)
    configs = {"default flags": []}
    if args.speculative_config:
        configs["--speculative-config " + args.speculative_config] = ["--speculative-config", args.speculative_config]
    served, figures = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra_args in configs.items():
            served[name] = zeroserve_figures(args, Path(tmp), extra_args)
            figures[name] = ratios(reference, served[name])
    print(f"transformers fp32: sequential decode {reference['sequential_decode_tok_s']:.1f} tok/s, "
          f"static batch 16 {reference['batch16_output_tok_s']:.1f} output tok/s")
    for name in configs:
        print_report(name, served[name], figures[name])
    args.result_json.write_text(json.dumps({
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "transformers": reference, "zeroserve": served, "ratios": figures,
        "settings": {key: str(value) for key, value in vars(args).items()},
    }, indent=2))


if __name__ == "__main__":
    main()
