"""`zeroserve bench ...`: the subcommand's parsers and their dispatch."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.model_files.model_registry import DEFAULT_MODEL

_LATENCY_METRICS = "ttft,tpot,itl,e2el"


def add_bench_parser(subparsers: Any) -> None:
    """Adds `bench` with its sub-subcommands (each sets `bench_handler`) to the `zeroserve` parser."""
    bench = subparsers.add_parser("bench", help="benchmark a running OpenAI-compatible server")
    commands = bench.add_subparsers(dest="bench_command", required=True)
    add_serve_parser(commands)
    add_throughput_parser(commands)


def run_bench(args: argparse.Namespace) -> int:
    """Runs the chosen `bench` sub-subcommand; its exit status."""
    handler: Callable[[argparse.Namespace], int] = args.bench_handler
    return handler(args)


def add_random_dataset_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-prompts", type=int, default=1000, help="requests to run (default: %(default)s)")
    parser.add_argument("--random-input-len", type=int, default=1024, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--random-output-len", type=int, default=128, help="max_tokens (default: %(default)s)")
    parser.add_argument(
        "--random-range-ratio", type=float, default=0.0,
        help="lengths drawn from [len·(1−r), len·(1+r)]; 0 gives exact lengths (default: %(default)s)",
    )


def add_serve_parser(commands: Any) -> None:
    serve = commands.add_parser(
        "serve", help="stream requests at a server and report throughput and latency, as `vllm bench serve`"
    )
    serve.set_defaults(bench_handler=run_serve)
    serve.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    serve.add_argument("--model", default=None, help="model to ask for (default: the first the server lists)")
    serve.add_argument("--endpoint", default="completions", choices=["completions", "chat"])
    serve.add_argument(
        "--tokenizer", default=DEFAULT_MODEL,
        help="model name or path whose tokenizer sizes the prompts and counts tokens (default: %(default)s)",
    )
    serve.add_argument(
        "--dataset", default=None, choices=["random", "chat", "jsonl"],
        help="random tokens, natural chat requests (sized by --random-input-len), or a file (default: random)",
    )
    serve.add_argument(
        "--dataset-path", type=Path, default=None, help="a JSONL file, one OpenAI request body a line (implies jsonl)"
    )
    add_random_dataset_args(serve)
    serve.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight (default: all)")
    serve.add_argument(
        "--request-rate", type=float, default=math.inf,
        help="requests per second, Poisson arrivals; inf sends all at once (default: %(default)s)",
    )
    serve.add_argument(
        "--burstiness", type=float, default=1.0,
        help="gamma shape of the arrival gaps: 1 is Poisson, lower is burstier (default: %(default)s)",
    )
    serve.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: every request runs to max_tokens")
    serve.add_argument("--seed", type=int, default=0, help="seeds prompts and arrivals (default: %(default)s)")
    serve.add_argument("--num-warmups", type=int, default=0, help="requests sent first, left out of the results")
    serve.add_argument(
        "--goodput", nargs="+", default=[], metavar="NAME:MS",
        help="service-level objectives for goodput, e.g. ttft:500 tpot:50 e2el:5000",
    )
    serve.add_argument(
        "--percentile-metrics", default=_LATENCY_METRICS, help="latencies to report (default: %(default)s)"
    )
    serve.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles (default: %(default)s)")
    serve.add_argument("--result-json", type=Path, default=None, help="write the results to this JSON file")
    serve.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    serve.add_argument(
        "--ready-check-timeout-sec", type=float, default=600.0, dest="ready_check_timeout_s",
        help="wait this long for the server to answer before the run (a server still loading); 0: "
        "do not wait (default: %(default)s)",
    )


def add_throughput_parser(commands: Any) -> None:
    from service.flags.engine_flags import add_engine_args, add_model_arg

    throughput = commands.add_parser(
        "throughput", help="offline throughput through LLM.generate, as `vllm bench throughput`"
    )
    throughput.set_defaults(bench_handler=run_throughput)
    add_model_arg(throughput)
    throughput.add_argument(
        "--dataset-path", type=Path, default=None, help="a JSONL file of completions bodies (default: random prompts)"
    )
    add_random_dataset_args(throughput)
    throughput.add_argument("--seed", type=int, default=0, help="seeds the prompts (default: %(default)s)")
    throughput.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: the model's default)"
    )
    throughput.add_argument("--num-warmups", type=int, default=0, help="prompts run first, left out of the figures")
    throughput.add_argument(
        "--multiprocessing", action=argparse.BooleanOptionalAction, default=None,
        help="run the engine in its own process (default: ZEROSERVE_ENABLE_MULTIPROCESSING, on)",
    )
    throughput.add_argument("--output-json", type=Path, default=None, help="write the results to this JSON file")
    throughput.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    add_engine_args(throughput)


def run_throughput(args: argparse.Namespace) -> int:
    from service.bench.throughput import print_and_save, run_throughput_benchmark

    try:
        print_and_save(run_throughput_benchmark(args), args.output_json)
    except (ValueError, OSError) as exc:
        print(f"zeroserve bench throughput: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zeroserve bench throughput: interrupted", file=sys.stderr)
        return 130
    return 0


def run_serve(args: argparse.Namespace) -> int:
    from service.bench.metrics import parse_goodput
    from service.bench.serve import run_serve_benchmark
    from service.bench.serve_config import ServeBenchConfig

    try:
        config = ServeBenchConfig(
            base_url=args.base_url,
            model=args.model,
            endpoint=args.endpoint,
            tokenizer=args.tokenizer,
            dataset=args.dataset or ("jsonl" if args.dataset_path is not None else "random"),
            dataset_path=args.dataset_path,
            num_prompts=args.num_prompts,
            random_input_len=args.random_input_len,
            random_output_len=args.random_output_len,
            random_range_ratio=args.random_range_ratio,
            max_concurrency=args.max_concurrency,
            request_rate=args.request_rate,
            burstiness=args.burstiness,
            ignore_eos=args.ignore_eos,
            seed=args.seed,
            num_warmups=args.num_warmups,
            goodput_slos_ms=parse_goodput(args.goodput),
            percentile_metrics=tuple(name.strip() for name in args.percentile_metrics.split(",") if name.strip()),
            metric_percentiles=tuple(float(p) for p in args.metric_percentiles.split(",")),
            result_json=args.result_json,
            disable_tqdm=args.disable_tqdm,
            ready_check_timeout_s=args.ready_check_timeout_s,
        )
        return run_serve_benchmark(config)
    except (ValueError, OSError) as exc:
        print(f"zeroserve bench serve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zeroserve bench serve: interrupted", file=sys.stderr)
        return 130
