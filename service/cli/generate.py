"""`zeroserve generate --input requests.jsonl --output results.jsonl [MODEL]`."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from service.bench.serve_config import ServeBenchConfig
from service.config import GatewayConfig
from service.flags.engine_flags import add_engine_args, add_model_arg, add_multiprocessing_arg, engine_config_from
from service.flags.setting_flags import add_setting_flags, setting_values
from service.observability.logging_setup import configure_logging

_SERVE_SETTINGS = ("served_model_names", "generation_config", "max_n")


def add_generate_parser(commands: Any) -> None:
    parser: argparse.ArgumentParser = commands.add_parser(
        "generate",
        help="run a JSONL file of OpenAI request bodies offline, results in input order",
        description=(
            "Runs every line of --input (a completions or chat request body, or an OpenAI batch "
            "line) and writes one result per line to --output, in input order. Rerunning with the "
            "same files skips the lines already written."
        ),
    )
    add_model_arg(parser)
    parser.add_argument("--input", "-i", type=Path, required=True, help="JSONL file of request bodies")
    parser.add_argument("--output", "-o", type=Path, required=True, help="JSONL file of results (appended)")
    parser.add_argument(
        "--max-in-flight", type=int, default=256, help="most lines submitted at once (default: %(default)s)"
    )
    # NOTE: the settings a request's answer depends on, declared once with `zeroserve serve`'s.
    add_setting_flags(parser, GatewayConfig, names=_SERVE_SETTINGS)
    add_multiprocessing_arg(parser)
    # NOTE: the progress bar's switch, declared once with the benchmarks'.
    add_setting_flags(parser, ServeBenchConfig, names=("disable_tqdm",))
    add_engine_args(parser)


def run_generate(args: argparse.Namespace) -> int:
    configure_logging()
    if not args.input.is_file():
        print(f"zeroserve generate: error: --input {args.input} is not a file", file=sys.stderr)
        return 2
    if args.max_in_flight < 1:
        print("zeroserve generate: error: --max-in-flight must be >= 1", file=sys.stderr)
        return 2
    from service.api.routes import batch_endpoints
    from service.frontend.llm_engine import LLMEngine
    from service.model_files.model_registry import resolve_model
    from service.model_files.tokenizer import Tokenizer
    from service.openai.batch_generate import BatchRunner, num_lines_left

    if num_lines_left(args.input, args.output) == 0:
        # NOTE: said before any engine starts: a rerun of a finished file has nothing to run.
        logging.getLogger("zeroserve").info(
            "every line of %s already has its result in %s: nothing to run (remove %s to run them again)",
            args.input, args.output, args.output,
        )
        return 0

    settings = setting_values(args, GatewayConfig, names=_SERVE_SETTINGS)
    try:
        resolved = resolve_model(args.model)
    except ValueError as exc:
        print(f"zeroserve generate: error: {exc}", file=sys.stderr)
        return 2
    # NOTE: results carry the first name, as a server's responses do when a request names none.
    model_name = settings["served_model_names"][0] if settings["served_model_names"] else resolved.name
    engine = LLMEngine(
        engine_config_from(args, str(resolved.path), model_name),
        Tokenizer.from_model(resolved.path),
        multiprocess_mode=args.multiprocessing,
    )
    defaults = {**resolved.generation_defaults, **dict(settings["generation_config"])}
    runner = BatchRunner(engine, model_name, defaults, batch_endpoints(), args.max_in_flight, settings["max_n"])
    try:
        num_written = runner.run(args.input, args.output, use_tqdm=not args.disable_tqdm)
    except KeyboardInterrupt:
        print("zeroserve generate: interrupted; rerun to continue where it stopped", file=sys.stderr)
        return 130
    finally:
        engine.shutdown()
    logging.getLogger("zeroserve").info("wrote %d results to %s", num_written, args.output)
    return 0
