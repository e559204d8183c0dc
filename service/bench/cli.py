"""`zeroserve bench ...`: the subcommand's parsers and their dispatch."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service.flags.setting_flags import add_setting_flags, setting_values


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


def add_serve_parser(commands: Any) -> None:
    from service.bench.serve_config import ServeBenchConfig

    serve = commands.add_parser(
        "serve", help="stream requests at a server and report throughput and latency, as `vllm bench serve`"
    )
    serve.set_defaults(bench_handler=run_serve)
    # NOTE: unchecked here: ServeBenchConfig checks the values together, naming the flags.
    add_setting_flags(serve, ServeBenchConfig, is_checked=False)


def add_throughput_parser(commands: Any) -> None:
    from service.bench.serve_config import SHARED_SETTINGS, ServeBenchConfig
    from service.flags.engine_flags import add_engine_args, add_model_arg, add_multiprocessing_arg

    throughput = commands.add_parser(
        "throughput", help="offline throughput through LLM.generate, as `vllm bench throughput`"
    )
    throughput.set_defaults(bench_handler=run_throughput)
    add_model_arg(throughput)
    # NOTE: the prompts are made as `bench serve` makes them, from the same settings.
    add_setting_flags(throughput, ServeBenchConfig, is_checked=False, names=SHARED_SETTINGS)
    throughput.add_argument(
        "--temperature", type=float, default=None, help="sampling temperature (default: the model's default)"
    )
    add_multiprocessing_arg(throughput)
    throughput.add_argument("--output-json", type=Path, default=None, help="write the results to this JSON file")
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
    from service.bench.serve import run_serve_benchmark
    from service.bench.serve_config import ServeBenchConfig

    try:
        config = ServeBenchConfig(**setting_values(args, ServeBenchConfig))
        return run_serve_benchmark(config)
    except (ValueError, OSError) as exc:
        print(f"zeroserve bench serve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zeroserve bench serve: interrupted", file=sys.stderr)
        return 130
