"""The engine's command-line flags, shared by every command that starts an engine."""

from __future__ import annotations

import argparse
import json

from service.curve import LinkSettings
from service.engine_launcher import EngineArgs
from service.model_registry import DEFAULT_MODEL


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", default=DEFAULT_MODEL,
        help=f"a known model name, a .gguf file or a Hugging Face model directory (default: {DEFAULT_MODEL})",
    )


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine")
    group.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
        help="activations and KV cache; auto: bfloat16 for a GGUF with 4-bit weights, else the "
        "checkpoint's dtype; float32 matches transformers token for token (default: %(default)s)",
    )
    group.add_argument(
        "--quantization", default="auto", choices=["auto", "gguf", "none"],
        help="auto: a GGUF's 4-bit weights run as int4 for small batches when the dtype is bfloat16; "
        "gguf: require that; none: dequantize every weight (default: %(default)s)",
    )
    group.add_argument(
        "--load-format", default="auto", choices=["auto", "dummy"],
        help="dummy: random weights of the model's shape, reading only its config (default: %(default)s)",
    )
    group.add_argument(
        "--hf-overrides", default=None, metavar="JSON", type=_json_object,
        help='model config fields to replace, e.g. \'{"num_hidden_layers": 1, "hidden_size": 64}\'',
    )
    group.add_argument(
        "--speculative-config", default=None, metavar="JSON", type=_speculative_config,
        help="speculative decoding for greedy requests (exact: same tokens, fewer steps when text "
        'repeats): n-gram drafts from the context, e.g. \'{"method": "ngram", "num_speculative_tokens": 3, '
        '"prompt_lookup_max": 4}\'; other keys: prompt_lookup_min, disable_by_batch_size (default: off)',
    )
    group.add_argument(
        "--device", default="auto",
        help="torch device of the engine: auto (CUDA when present), cpu, cuda, cuda:N (default: %(default)s)",
    )
    group.add_argument(
        "--kv-cache-memory", type=float, default=None,
        help="GiB for the KV cache (default: a share of free GPU memory, or of free RAM on the CPU)",
    )
    group.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    group.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in one step (default: %(default)s)")
    group.add_argument(
        "--max-num-batched-tokens", type=int, default=512,
        help="token budget of one step: prompts longer than what is left of it are prefilled in "
        "chunks, so running streams keep their pace (default: %(default)s)",
    )
    group.add_argument("--num-threads", type=int, default=None, help="torch threads in the engine (default: all cores)")
    group.add_argument(
        "--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
        help="reuse the KV cache of shared prompt prefixes (default: on)",
    )
    group.add_argument(
        "--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
        help="fcfs, or priority: lower `priority` values first, ties by arrival (default: %(default)s)",
    )


def engine_args_from(args: argparse.Namespace, model_path: str = "", model_name: str = "") -> EngineArgs:
    return EngineArgs(
        model_path=model_path,
        model_name=model_name,
        dtype=args.dtype,
        device=args.device,
        kv_cache_memory_gib=args.kv_cache_memory,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_threads=args.num_threads,
        enable_prefix_caching=args.enable_prefix_caching,
        scheduling_policy=args.scheduling_policy,
        quantization=args.quantization,
        load_format=args.load_format,
        hf_overrides=args.hf_overrides or "",
        speculative_config=args.speculative_config or "",
    )


def _json_object(text: str) -> str:
    """The flag's text, once checked to be a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return text


_SPECULATIVE_KEYS: dict[str, type] = {
    "method": str, "num_speculative_tokens": int, "prompt_lookup_min": int, "prompt_lookup_max": int,
    "disable_by_batch_size": int,
}


def _speculative_config(text: str) -> str:
    """The flag's text, once checked to be an n-gram speculative config (the engine checks ranges)."""
    config = json.loads(_json_object(text))
    for key, value in config.items():
        kind = _SPECULATIVE_KEYS.get(key)
        if kind is None:
            raise argparse.ArgumentTypeError(f"unknown key {key!r}; known: {', '.join(_SPECULATIVE_KEYS)}")
        is_positive_int = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        if not (is_positive_int if kind is int else isinstance(value, str)):
            raise argparse.ArgumentTypeError(f"{key} must be {'a positive integer' if kind is int else 'a string'}")
    if config.get("method", "ngram") != "ngram":
        raise argparse.ArgumentTypeError(f"method {config['method']!r} is not supported; only ngram")
    return text


def add_scale_out_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("scale-out")
    group.add_argument(
        "--data-parallel-size", type=int, default=1, metavar="N",
        help="engine processes this gateway starts; each request goes to the least loaded "
        "(0: none, engines join from other hosts through --engine-address) (default: %(default)s)",
    )
    group.add_argument(
        "--engine-address", default=None, metavar="tcp://HOST:PORT",
        help="where engines on other hosts join (`zeroserve engine --gateway` it): requests on PORT, "
        "outputs on PORT+1 (default: none; local engines use private ipc:// sockets)",
    )
    group.add_argument(
        "--curve-secret-key", default=None, metavar="FILE",
        help="the gateway's CURVE secret key (`zeroserve keys generate`): links to engines are "
        "encrypted and both ends authenticated (default: off)",
    )
    group.add_argument(
        "--curve-authorized-keys", default=None, metavar="DIR",
        help="folder of the public keys (*.key) of engines allowed to join (with --curve-secret-key)",
    )
    group.add_argument(
        "--api-server-count", type=int, default=1, metavar="K",
        help="gateway processes sharing the port, each connected to every engine (default: %(default)s)",
    )
    # NOTE: how a gateway process of several learns its place (service/api_servers.py sets them).
    group.add_argument("--api-server-index", type=int, default=None, help=argparse.SUPPRESS)
    group.add_argument("--listen-fd", type=int, default=None, help=argparse.SUPPRESS)
    group.add_argument("--engine-input-address", default=None, help=argparse.SUPPRESS)
    group.add_argument("--engine-output-address", default=None, help=argparse.SUPPRESS)
    group.add_argument(
        "--heartbeat-timeout", type=float, default=5.0, metavar="SECONDS",
        help="an engine silent this long is taken out of rotation, its requests failed (default: %(default)s)",
    )


def link_settings_from(args: argparse.Namespace) -> LinkSettings:
    return LinkSettings(
        engine_address=args.engine_address,
        curve_secret_key=args.curve_secret_key,
        curve_authorized_keys=args.curve_authorized_keys,
        heartbeat_timeout_s=args.heartbeat_timeout,
    )
