"""The engine's command-line flags, shared by every command that starts an engine."""

from __future__ import annotations

import argparse

from proto.engine_config import EngineConfig
from service.cli.setting_flags import add_setting_flags, argument_group, setting_values
from service.client.curve import LinkSettings
from service.model_files.model_registry import DEFAULT_MODEL


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", default=DEFAULT_MODEL,
        help=f"a known model name, a .gguf file or a Hugging Face model directory (default: {DEFAULT_MODEL})",
    )


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """A flag for every engine setting (proto/engine_config.py), with its default, help and check."""
    add_setting_flags(parser, EngineConfig, "engine")


def engine_config_from(args: argparse.Namespace, model_path: str = "", model_name: str = "") -> EngineConfig:
    return EngineConfig(model_path=model_path, model_name=model_name, **setting_values(args, EngineConfig))


def add_scale_out_args(parser: argparse.ArgumentParser) -> None:
    group = argument_group(parser, "scale-out")
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
    # NOTE: how a gateway process of several learns its place (service/api/api_servers.py sets them).
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
