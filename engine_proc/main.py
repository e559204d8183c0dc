"""Engine process entry: `python -m engine_proc --model PATH --input-address ... --output-address ...`."""

from __future__ import annotations

import argparse
import ctypes
import logging
import signal
import sys

from engine_proc.config import DTYPES, LOAD_FORMATS, QUANTIZATIONS, EngineConfig
from engine_proc.link import add_link_args, parse_link_args, socket_options
from proto.log_format import LOG_FORMATS, TEXT_FORMAT, JsonFormatter


def parse_args(argv: list[str] | None = None) -> EngineConfig:
    parser = argparse.ArgumentParser(prog="python -m engine_proc", description=__doc__)
    parser.add_argument("--model", required=True, help="a .gguf file or a Hugging Face model directory")
    parser.add_argument("--model-name", default="")
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument(
        "--input-address", required=True, help="the gateway's ROUTER address (comma-separated: several gateways)"
    )
    parser.add_argument(
        "--output-address", required=True, help="the gateway's PULL address (comma-separated, in the same order)"
    )
    parser.add_argument(
        "--dtype", default="auto", choices=DTYPES,
        help="auto: bfloat16 for a GGUF with 4-bit weights, else the checkpoint's dtype; "
        "float32 matches transformers token for token",
    )
    parser.add_argument(
        "--quantization", default="auto", choices=QUANTIZATIONS,
        help="auto: a GGUF's 4-bit weights run as int4 for small batches when the dtype is bfloat16; "
        "gguf: require that; none: dequantize every weight",
    )
    parser.add_argument(
        "--load-format", default="auto", choices=LOAD_FORMATS,
        help="dummy: random weights of the model's shape (reads only the config)",
    )
    parser.add_argument(
        "--hf-overrides", default="", help='a JSON object of model config fields to replace, e.g. \'{"num_hidden_layers": 1}\'',
    )
    parser.add_argument(
        "--speculative-config", default="",
        help='speculative decoding as a JSON object, e.g. \'{"method": "ngram", "num_speculative_tokens": 3}\'',
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument(
        "--kv-cache-memory", type=float, default=None,
        help="GiB for the KV cache (default: a share of free GPU memory, or of free RAM on the CPU)",
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--num-threads", type=int, default=None)
    parser.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
        help="reuse the KV cache of shared prompt prefixes",
    )
    parser.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"])
    add_link_args(parser)
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS)
    args = parser.parse_args(argv)
    return EngineConfig(
        model_path=args.model,
        model_name=args.model_name,
        engine_index=args.engine_index,
        input_address=args.input_address,
        output_address=args.output_address,
        dtype=args.dtype,
        device=args.device,
        block_size=args.block_size,
        kv_cache_memory_gib=args.kv_cache_memory,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_threads=args.num_threads,
        enable_prefix_caching=args.enable_prefix_caching,
        scheduling_policy=args.scheduling_policy,
        quantization=args.quantization,
        load_format=args.load_format,
        hf_overrides=args.hf_overrides,
        speculative_config=args.speculative_config,
    )


def _log_format(argv: list[str] | None) -> str:
    """--log-format, read before the rest so the first lines already have it."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS)
    log_format: str = parser.parse_known_args(argv)[0].log_format
    return log_format


def _die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this process when the gateway dies."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    handler = logging.StreamHandler()
    is_json = _log_format(argv) == "json"
    handler.setFormatter(JsonFormatter() if is_json else logging.Formatter(TEXT_FORMAT.replace("%(name)s", "engine")))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    config = parse_args(argv)
    if not parse_link_args(argv).is_headless:
        _die_with_parent()
    from engine_proc.core import EngineCore
    from engine_proc.core_proc import EngineCoreProc
    link = parse_link_args(argv)
    engine_core = EngineCore(config)
    proc = EngineCoreProc(
        engine_core, config.input_address.split(","), config.output_address.split(","), socket_options(link),
        link.accept_timeout_s,
    )
    if link.is_headless:
        signal.signal(signal.SIGTERM, lambda signum, frame: proc.begin_drain())
    return proc.run()
