"""The engine's command-line flags, shared by every command that starts an engine."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from proto.engine_config import EngineConfig, check_value, flag_of
from service.client.curve import LinkSettings
from service.model_files.model_registry import DEFAULT_MODEL


def add_model_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", default=DEFAULT_MODEL,
        help=f"a known model name, a .gguf file or a Hugging Face model directory (default: {DEFAULT_MODEL})",
    )


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """A flag for every engine setting (proto/engine_config.py), with its default, help and check."""
    group = parser.add_argument_group("engine")
    for config_field in dataclasses.fields(EngineConfig):
        if "flag" not in config_field.metadata:
            continue  # the model: a positional argument, resolved to a path
        kwargs: dict[str, Any] = {"default": config_field.default, "dest": config_field.name}
        if config_field.type == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _flag_type(config_field)
        if config_field.metadata["choices"]:
            kwargs["choices"] = config_field.metadata["choices"]
        if config_field.metadata["is_json"]:
            kwargs["metavar"] = "JSON"
        elif not config_field.metadata["choices"] and config_field.type != "bool":
            kwargs["metavar"] = flag_of(config_field).removeprefix("--").replace("-", "_").upper()
        default = "" if "(default:" in config_field.metadata["help"] else " (default: %(default)s)"
        group.add_argument(flag_of(config_field), help=config_field.metadata["help"] + default, **kwargs)


def _flag_type(config_field: dataclasses.Field[Any]) -> Callable[[str], Any]:
    """The flag's text as the field's type, checked as the config checks it (argparse names the flag)."""
    parse = {"str": str, "int": int, "float": float, "int | None": int, "float | None": float}[str(config_field.type)]

    def convert(text: str) -> Any:
        try:
            value = parse(text)
            check_value(config_field, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{config_field.name}: ")) from exc
        return value

    convert.__name__ = parse.__name__
    return convert


def engine_config_from(args: argparse.Namespace, model_path: str = "", model_name: str = "") -> EngineConfig:
    names = [config_field.name for config_field in dataclasses.fields(EngineConfig) if "flag" in config_field.metadata]
    return EngineConfig(model_path=model_path, model_name=model_name, **{name: getattr(args, name) for name in names})


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
