"""Engine process entry: `python -m engine_proc --config JSON --input-address ... --output-address ...`."""

from __future__ import annotations

import argparse
import os
import signal
from dataclasses import dataclass

from engine_proc.link import socket_options
from proto import envs
from proto.engine_config import EngineConfig
from proto.engine_link import LinkConfig, add_link_args, die_with_parent, link_config_from
from proto.log_format import DEFAULT_LOG_FORMAT, LOG_FORMATS, TEXT_FORMAT, configure_logging


@dataclass(frozen=True)
class EngineLaunch:
    """What only this engine process has: its index and its gateways' addresses."""

    engine_index: int
    input_addresses: list[str]
    output_addresses: list[str]
    link: LinkConfig


def _engine_config(text: str) -> EngineConfig:
    try:
        return EngineConfig.from_json(text)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _add_log_format_arg(parser: argparse.ArgumentParser) -> None:
    """`--log-format`, which the gateway passes its own `--log-format` as."""
    parser.add_argument("--log-format", default=DEFAULT_LOG_FORMAT, choices=LOG_FORMATS)


def parse_args(argv: list[str] | None = None) -> tuple[EngineConfig, EngineLaunch]:
    parser = argparse.ArgumentParser(prog="python -m engine_proc", description=__doc__)
    parser.add_argument(
        "--config", required=True, metavar="JSON", type=_engine_config,
        help="the engine's settings as a JSON object of proto.engine_config.EngineConfig's fields",
    )
    parser.add_argument("--engine-index", type=int, default=0)
    parser.add_argument(
        "--input-address", required=True, help="the gateway's ROUTER address (comma-separated: several gateways)"
    )
    parser.add_argument(
        "--output-address", required=True, help="the gateway's PULL address (comma-separated, in the same order)"
    )
    add_link_args(parser)
    _add_log_format_arg(parser)
    args = parser.parse_args(argv)
    inputs, outputs = args.input_address.split(","), args.output_address.split(",")
    try:
        link = link_config_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args.config, EngineLaunch(args.engine_index, inputs, outputs, link)


def _log_format(argv: list[str] | None) -> str:
    """--log-format, read before the rest so the first lines already have it."""
    parser = argparse.ArgumentParser(add_help=False)
    _add_log_format_arg(parser)
    log_format: str = parser.parse_known_args(argv)[0].log_format
    return log_format


def main(argv: list[str] | None = None) -> int:
    configure_logging(_log_format(argv), TEXT_FORMAT.replace("%(name)s", "engine"))
    config, launch = parse_args(argv)
    link = launch.link
    if not link.is_headless:
        # NOTE: the gateway owns shutdown and stops its engines itself; a terminal's Ctrl-C (the
        # engine runs in a session of its own, so none should reach it) must not kill them first.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        die_with_parent()
    from engine_proc.core import make_core
    from engine_proc.core_proc import EngineCoreProc
    try:
        engine_core = make_core(config, launch.engine_index)
    except Exception as exc:
        # NOTE: the gateway that started us tells its clients why (a broken file, too little memory).
        if (error_file := envs.engine_error_file()) is not None:
            error_file.write_text(f"{type(exc).__name__}: {exc}")
        raise
    proc = EngineCoreProc(
        engine_core, launch.input_addresses, launch.output_addresses, socket_options(link),
        link.accept_timeout_s,
    )
    if link.is_headless:
        # NOTE: Ctrl-C or SIGTERM leaves gracefully; a second one exits at once.
        def on_signal(signum: int, frame: object) -> None:
            if proc.drain_deadline is not None:
                os._exit(128 + signum)
            proc.begin_drain()

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
    return proc.run()
