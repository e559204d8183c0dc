"""The `zeroserve` command: `zeroserve serve [MODEL] [--host H] [--port P] ...`."""

from __future__ import annotations

import argparse
import copy
import os
import sys
from collections.abc import Mapping, Sequence

from proto import envs
from service.bench.cli import add_bench_parser, run_bench
from service.cli.engine import add_engine_parser, add_keys_parser, run_engine, run_keys
from service.cli.generate import add_generate_parser, run_generate
from service.client.curve import LinkSettings
from service.config import GatewayConfig
from service.flags.engine_flags import add_engine_args, add_models_arg, engine_config_from
from service.flags.setting_flags import add_setting_flags, setting_values
from service.model_files.model_registry import DEFAULT_MODEL
from service.observability.logging_setup import configure_logging


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroserve", description="An OpenAI-compatible LLM server.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve a model over the OpenAI HTTP API")
    add_models_arg(serve)
    add_setting_flags(serve, GatewayConfig, is_checked=False)
    add_engine_args(serve)
    add_setting_flags(serve, LinkSettings, is_checked=False)
    add_bench_parser(commands)
    add_generate_parser(commands)
    add_engine_parser(commands)
    add_keys_parser(commands)
    # NOTE: last, so that every flag gets its variable.
    for command in ENV_COMMANDS:
        envs.document_flag_vars(_subparser(parser, *command))
    _every_command(parser)
    return parser


class _HelpFormatter(argparse.HelpFormatter):
    """Defaults as a user writes them: `on` / `off` for a switch, `unset` for none, a list comma-separated,
    not Python's values."""

    def _expand_help(self, action: argparse.Action) -> str:
        default = action.default
        if isinstance(default, tuple):
            text = ",".join(format(item, "g") if isinstance(item, float) else str(item) for item in default)
        elif isinstance(default, bool):
            text = "on" if default else "off"
        elif default is None:
            text = "unset"
        else:
            return super()._expand_help(action)
        action = copy.copy(action)
        action.default = text
        return super()._expand_help(action)


def _every_command(parser: argparse.ArgumentParser) -> None:
    """Every command takes its flags only as spelled (`--max-num-seq` is not `--max-num-seqs`), and writes
    its defaults as a user would."""
    parser.allow_abbrev = False
    parser.formatter_class = _HelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _every_command(subparser)


# NOTE: the commands that start an engine read ZEROSERVE_<FLAG> for each of their flags, as
# LLM() does for its engine settings; the clients (`bench serve`, `keys`) read none.
ENV_COMMANDS = (("serve",), ("generate",), ("engine",), ("bench", "throughput"))


def parse_args(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """The command line, with ZEROSERVE_<FLAG> variables as the flags' defaults (ENV_COMMANDS);
    a bad value exits with status 2 and a message naming the flag or the variable."""
    parser = build_parser()
    args, command_path = _parse_command(parser, argv)
    if command_path not in ENV_COMMANDS:
        return args
    command = _subparser(parser, *command_path)
    try:
        defaults = envs.flag_defaults_from_env(command, os.environ if environ is None else environ)
    except ValueError as exc:
        command.error(str(exc))
    # NOTE: an appending flag (--api-key) would add to its variable's list; given, it replaces it.
    defaults = {
        dest: value for dest, value in defaults.items() if not (isinstance(value, list) and getattr(args, dest))
    }
    command.set_defaults(**defaults)
    return _parse_command(parser, argv)[0]


def _parse_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> tuple[argparse.Namespace, tuple[str, ...]]:
    """The command line and its command's path (("bench", "serve")); an unknown flag exits 2 with that
    command's usage (argparse would print the top level's, which names none of the command's flags)."""
    args, unknown = parser.parse_known_args(argv)
    command_path = (args.command, *([sub] if (sub := getattr(args, f"{args.command}_command", None)) else []))
    if unknown:
        _subparser(parser, *command_path).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args, command_path


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    """The parser of `zeroserve serve` for ("serve",), of `zeroserve bench throughput` for ("bench", "throughput")."""
    for command in path:
        action = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
        parser = action.choices[command]
    return parser


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    models = tuple(args.model) or (() if args.models_dir or args.models_config else (DEFAULT_MODEL,))
    return GatewayConfig(
        model=models[0] if models else "",
        models=models,
        engine=engine_config_from(args),
        link=LinkSettings(**setting_values(args, LinkSettings)),
        **setting_values(args, GatewayConfig),
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "bench":
        return run_bench(args)
    if args.command == "generate":
        return run_generate(args)
    if args.command == "engine":
        return run_engine(args)
    if args.command == "keys":
        return run_keys(args)
    configure_logging(args.log_format, api_server=args.api_server_index)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        given = sys.argv[1:] if argv is None else argv
        print(f"zeroserve: error: {envs.naming_the_variable(str(exc), given, os.environ)}", file=sys.stderr)
        return 2
    if config.api_server_count > 1:
        from service.serving.api_servers import run_api_servers

        return run_api_servers(config, sys.argv[1:] if argv is None else argv)
    import uvloop

    from service.client.core_client import EngineDeadError
    from service.serving.server import serve

    try:
        uvloop.run(serve(config))
    except ValueError as exc:
        print(f"zeroserve: error: {exc}", file=sys.stderr)
        return 2
    except EngineDeadError as exc:
        print(f"zeroserve: error: {exc}", file=sys.stderr)
        return 1
    return 0

