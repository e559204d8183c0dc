"""The `zeroserve` command: `zeroserve serve [MODEL] [--host H] [--port P] ...`."""

from __future__ import annotations

import argparse
import json
import asyncio
import logging
import signal
import sys
from dataclasses import replace

from service.bench.cli import add_bench_parser, run_bench
from service.generate_cli import add_generate_parser, run_generate
from service.config import GatewayConfig
from service.engine_launcher import EngineArgs
from service.logging_setup import LOG_FORMATS, configure_logging
from service.model_registry import DEFAULT_MODEL

logger = logging.getLogger("zeroserve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroserve", description="An OpenAI-compatible LLM server.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over the OpenAI HTTP API")
    serve.add_argument(
        "model", nargs="?", default=DEFAULT_MODEL,
        help=f"a known model name, a .gguf file or a Hugging Face model directory (default: {DEFAULT_MODEL})",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    serve.add_argument("--served-model-name", nargs="+", default=None, help="names clients use for the model")
    serve.add_argument(
        "--override-generation-config", type=json.loads, default=None, metavar="JSON",
        help='sampling defaults over the model\'s, e.g. \'{"temperature": 0.7}\'',
    )
    serve.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    serve.add_argument("--device", default="cpu", help="torch device of the engine (default: %(default)s)")
    serve.add_argument(
        "--kv-cache-memory", type=float, default=None,
        help="GiB for the KV cache (default: a share of free GPU memory, or of free RAM on the CPU)",
    )
    serve.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    serve.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in one step (default: %(default)s)")
    serve.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="token budget of one step (default: %(default)s)"
    )
    serve.add_argument("--num-threads", type=int, default=None, help="torch threads in the engine (default: all cores)")
    serve.add_argument("--max-n", type=int, default=16, help="most choices one request may ask for (default: %(default)s)")
    serve.add_argument(
        "--max-request-body-bytes", type=int, default=8 * 2**20,
        help="larger request bodies get 413 before parsing (default: %(default)s)",
    )
    serve.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
        help="reuse the KV cache of shared prompt prefixes (default: on)",
    )
    serve.add_argument(
        "--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
        help="fcfs, or priority: lower `priority` values first, ties by arrival (default: %(default)s)",
    )
    serve.add_argument(
        "--log-format", default="text", choices=LOG_FORMATS,
        help="text lines, or one JSON object per line; finished requests' figures become keys (default: %(default)s)",
    )
    add_bench_parser(commands)
    add_generate_parser(commands)
    return parser


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    engine = EngineArgs(
        model_path="",
        model_name="",
        dtype=args.dtype,
        device=args.device,
        kv_cache_memory_gib=args.kv_cache_memory,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_threads=args.num_threads,
        enable_prefix_caching=args.enable_prefix_caching,
        scheduling_policy=args.scheduling_policy,
    )
    return GatewayConfig(
        model=args.model,
        host=args.host,
        port=args.port,
        served_model_names=tuple(args.served_model_name or ()),
        generation_config=tuple((args.override_generation_config or {}).items()),
        engine=engine,
        max_n=args.max_n,
        max_request_body_bytes=args.max_request_body_bytes,
    )


async def serve(config: GatewayConfig) -> None:
    import hypercorn.asyncio
    import hypercorn.config

    from service.api.app import create_app
    from service.api.server_state import ServerState
    from service.async_llm import AsyncLLM
    from service.async_mp_client import AsyncMPClient
    from service.metrics import PrometheusStatLogger
    from service.model_registry import resolve_model
    from service.request_log import RequestLogger
    from service.tokenizer import Tokenizer

    resolved = resolve_model(config.model)
    names = list(config.served_model_names or (resolved.name,))
    engine_args = replace(config.engine, model_path=str(resolved.path), model_name=names[0])
    client = AsyncMPClient(engine_args)
    try:
        # NOTE: the tokenizer loads here while the engine loads its weights.
        tokenizer = await asyncio.to_thread(Tokenizer.from_model, resolved.path)
        ready = await client.wait_ready()
    except BaseException:
        client.shutdown()
        raise
    metrics = PrometheusStatLogger(names[0])
    llm = AsyncLLM(client, tokenizer, ready, stat_loggers=[metrics, RequestLogger()])
    generation_defaults = {**resolved.generation_defaults, **dict(config.generation_config)}
    app = create_app(
        ServerState(
            llm, names, generation_defaults, config.max_n, config.max_request_body_bytes,
            metrics_registry=metrics.registry,
        )
    )
    hypercorn_config = hypercorn.config.Config()
    hypercorn_config.bind = [f"{config.host}:{config.port}"]
    hypercorn_config.graceful_timeout = 3.0
    # NOTE: hypercorn's own lines go through our handler, so they follow --log-format.
    hypercorn_config.errorlog = logging.getLogger("hypercorn.error")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    logger.info("serving %s on http://%s:%d", names[0], config.host, config.port)
    try:
        await hypercorn.asyncio.serve(app, hypercorn_config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    finally:
        llm.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "bench":
        return run_bench(args)
    if args.command == "generate":
        return run_generate(args)
    configure_logging(args.log_format)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"zeroserve: error: {exc}", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run(serve(config))
    except ValueError as exc:
        print(f"zeroserve: error: {exc}", file=sys.stderr)
        return 2
    return 0
