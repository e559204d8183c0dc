"""Every setting is declared once: each `zeroserve` command's flag for a setting is generated from its
config field, no two configs declare the same setting, no code writes an engine setting's default
again, and no flag is written out twice."""

from __future__ import annotations

import argparse
import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from proto.engine_config import EngineConfig
from proto.settings import flag_of
from service.bench.serve_config import ServeBenchConfig
from service.cli.main import build_parser
from service.client.curve import LinkSettings
from service.config import GatewayConfig
from service.flags.setting_flags import add_setting_flags, settings_of

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("proto", "engine_proc", "service")
CONFIGS: tuple[type[Any], ...] = (EngineConfig, GatewayConfig, LinkSettings, ServeBenchConfig)
SETTINGS = {config_field.name: config for config in CONFIGS for config_field in settings_of(config)}
# NOTE: flags named like a gateway setting that are another process's own: the headless engine's
# CURVE key is its own secret (proto/engine_link.py), not the gateway's.
OTHER_SETTINGS_OF_THE_NAME = {("engine", "curve_secret_key")}
# NOTE: names an engine setting shares with something else, each with why its default is its own.
SAME_NAME_OTHER_THING = {
    ("engine_proc/loader/__init__.py", "device"): "a torch device the runner resolved \"auto\" to",
    ("engine_proc/sampling_metadata.py", "dtype"): "a tensor's dtype",
    ("proto/handshake.py", "max_model_len"): "the engine's context length as loaded, sent in its ready message",
    ("proto/handshake.py", "block_size"): "the engine's block size, sent in its ready message",
    ("proto/handshake.py", "device"): "the torch device the engine resolved \"auto\" to, sent in its ready message",
    ("service/observability/metrics.py", "max_model_len"): "the served context length, capping histogram buckets",
}


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Each command's parser (`bench serve` ...), by its words."""
    yield " ".join(path), parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, subparser in action.choices.items():
                yield from commands(subparser, (*path, name))


def generated_flag(config: type[Any], name: str) -> argparse.Action:
    parser = argparse.ArgumentParser(add_help=False)
    add_setting_flags(parser, config, names=(name,))
    return parser._actions[0]


def described(action: argparse.Action) -> tuple[Any, ...]:
    # NOTE: the commands that read ZEROSERVE_<FLAG> end each help line with its variable.
    help_text = re.sub(r" \[env: \w+\]$", "", action.help or "").replace(" (default: %(default)s)", "")
    return (tuple(action.option_strings), action.default, action.choices, action.nargs, action.metavar, help_text)


def test_every_setting_flag_is_generated_from_its_field() -> None:
    num_checked = 0
    for command, parser in commands(build_parser()):
        dests = [action.dest for action in parser._actions if action.option_strings]
        assert not [dest for dest, count in Counter(dests).items() if count > 1], command
        for action in parser._actions:
            config = SETTINGS.get(action.dest)
            if not action.option_strings or config is None or (command, action.dest) in OTHER_SETTINGS_OF_THE_NAME:
                continue
            assert described(action) == described(generated_flag(config, action.dest)), (command, action.dest)
            num_checked += 1
    assert num_checked > 100


def test_no_setting_is_declared_by_two_configs() -> None:
    names = [config_field.name for config in CONFIGS for config_field in settings_of(config)]
    assert [name for name, count in Counter(names).items() if count > 1] == []


def source_files() -> Iterator[tuple[str, ast.Module]]:
    for top in SOURCE_ROOTS:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text())


def defaults_of(node: ast.AST) -> list[tuple[str, ast.expr]]:
    """The (name, default) of each parameter of a function, or of a field with a value."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
        positional = [*node.args.posonlyargs, *node.args.args]
        pairs = list(zip(positional[len(positional) - len(node.args.defaults):], node.args.defaults, strict=True))
        pairs += [(arg, default) for arg, default in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True) if default]
        return [(arg.arg, default) for arg, default in pairs]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
        return [(node.target.id, node.value)]
    return []


def is_read_from_a_config(name: str, default: ast.expr) -> bool:
    """None (not given), or the setting of the same name read from somewhere (`EngineConfig.dtype`)."""
    is_none = isinstance(default, ast.Constant) and default.value is None
    return is_none or (isinstance(default, ast.Attribute) and default.attr == name)


def test_no_engine_setting_default_is_written_again() -> None:
    engine_settings = {config_field.name for config_field in settings_of(EngineConfig)}
    written_again = []
    for path, module in source_files():
        if path == "proto/engine_config.py":
            continue
        for node in ast.walk(module):
            for name, default in defaults_of(node):
                if name in engine_settings and (path, name) not in SAME_NAME_OTHER_THING:
                    if not is_read_from_a_config(name, default):
                        written_again.append(f"{path}:{default.lineno} {name} = {ast.unparse(default)}")
    assert written_again == []


def test_the_names_shared_with_other_things_are_still_there() -> None:
    found = {
        (path, name) for path, module in source_files() for node in ast.walk(module) for name, _ in defaults_of(node)
    }
    assert set(SAME_NAME_OTHER_THING) <= found


def hand_written_flags() -> Iterator[tuple[str, str, ast.expr | None]]:
    """The (flag, help, default) of each `add_argument("--flag", ...)` in the source."""
    for _, module in source_files():
        for node in ast.walk(module):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant) and str(first.value).startswith("--"):
                    keywords = {keyword.arg: keyword.value for keyword in node.keywords}
                    help_text = ast.unparse(keywords["help"]) if "help" in keywords else ""
                    yield first.value, help_text, keywords.get("default")


def test_no_flag_is_written_out_twice() -> None:
    """A flag written by hand with the same help in two places is a copy: the commands should share one."""
    declared = [(flag, help_text) for flag, help_text, _ in hand_written_flags()]
    assert len(declared) > 10
    assert [flag for (flag, _), count in Counter(declared).items() if count > 1] == []


def test_a_setting_flag_written_by_hand_reads_its_default() -> None:
    """Where a process cannot generate a setting's flag (`python -m engine_proc` imports nothing of the
    gateway's), its default is None or read from a shared name, never written again."""
    setting_flags = {flag_of(config_field) for config in CONFIGS for config_field in settings_of(config)}
    literal_defaults = [
        flag for flag, _, default in hand_written_flags()
        if flag in setting_flags and isinstance(default, ast.Constant) and default.value is not None
    ]
    assert literal_defaults == []
