"""Every environment variable zeroserve reads, declared once: the table below (each with its
default, parser and meaning), and ZEROSERVE_<FLAG> for each `zeroserve serve` flag (generated from
its parser; the flag beats the variable). Read once, a bad value fails loudly naming it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast


@dataclass(frozen=True)
class EnvVar:
    """One declared environment variable: its default and how to parse it."""

    name: str
    default: str
    parse: Callable[[str], Any]
    help: str


def _path(value: str) -> Path:
    if not value.strip():
        raise ValueError("must be a non-empty path")
    return Path(value).expanduser()


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be 1/0, true/false, yes/no or on/off")


def _non_negative_float(value: str) -> float:
    number = float(value)
    if not number >= 0:
        raise ValueError("must be a number >= 0")
    return number


def _text(value: str) -> str:
    return value


ENV_VARS: dict[str, EnvVar] = {
    var.name: var
    for var in (
        EnvVar("ZEROSERVE_CACHE", "~/.cache/zeroserve", _path, "Where fetched models are kept."),
        EnvVar(
            "ZEROSERVE_ENABLE_MULTIPROCESSING", "1", _bool,
            "LLM/LLMEngine: run the engine in its own process (1) or in the caller's (0).",
        ),
        EnvVar(
            "ZEROSERVE_STATS_LOG_INTERVAL", "10", _non_negative_float,
            "Seconds between stats log lines (0: no stats log).",
        ),
        EnvVar(
            "ZEROSERVE_PLAN_CACHE", "", _text,
            "Where the engine keeps the matmul plans it measured at load, for the next load of the same"
            " model on the same machine (empty: ZEROSERVE_CACHE/plans; off: measure at every load).",
        ),
        EnvVar(
            "ZEROSERVE_CPU_KERNELS", "1", _bool,
            "The engine builds and runs its C++ CPU kernels where the CPU has them (0: torch ops only).",
        ),
        # NOTE: environment, not argv, for a local engine's ephemeral keys: `ps` shows argv.
        EnvVar(
            "ZEROSERVE_GATEWAY_CURVE_PUBLIC", "", _text,
            "Set by a gateway for its local engines with CURVE on: the gateway's public key.",
        ),
        EnvVar("ZEROSERVE_ENGINE_CURVE_PUBLIC", "", _text, "Likewise: the local engine's public key."),
        EnvVar("ZEROSERVE_ENGINE_CURVE_SECRET", "", _text, "Likewise: the local engine's secret key."),
        EnvVar(
            "ZEROSERVE_ENGINE_ERROR_FILE", "", _text,
            "Set by a gateway for its local engines: where an engine that cannot load its model writes why.",
        ),
    )
}


@cache
def read(name: str) -> Any:
    """The parsed value of a declared variable; a bad value raises ValueError naming it."""
    var = ENV_VARS[name]
    raw = os.environ.get(name, var.default)
    try:
        return var.parse(raw)
    except ValueError as exc:
        raise ValueError(f"Bad value {raw!r} for environment variable {name} ({var.help}): {exc}") from exc


def cache_dir() -> Path:
    """Root folder for fetched models (ZEROSERVE_CACHE)."""
    return cast(Path, read("ZEROSERVE_CACHE"))


def engine_error_file() -> Path | None:
    """Where this engine writes why it could not start (ZEROSERVE_ENGINE_ERROR_FILE), or None."""
    value = cast(str, read("ZEROSERVE_ENGINE_ERROR_FILE"))
    return Path(value) if value else None


def plan_cache_dir() -> Path | None:
    """Folder of saved matmul plans (ZEROSERVE_PLAN_CACHE), or None when plans are not kept."""
    value = cast(str, read("ZEROSERVE_PLAN_CACHE")).strip()
    if value.lower() in ("off", "0", "none", "false", "no"):
        return None
    return _path(value) if value else cache_dir() / "plans"


def enable_multiprocessing() -> bool:
    """Whether LLM/LLMEngine run the engine in its own process (ZEROSERVE_ENABLE_MULTIPROCESSING)."""
    return cast(bool, read("ZEROSERVE_ENABLE_MULTIPROCESSING"))


def stats_log_interval() -> float:
    """Seconds between stats log lines; 0 turns the log off (ZEROSERVE_STATS_LOG_INTERVAL)."""
    return cast(float, read("ZEROSERVE_STATS_LOG_INTERVAL"))


def cpu_kernels() -> bool:
    """Whether the engine may build and run its C++ CPU kernels (ZEROSERVE_CPU_KERNELS)."""
    return cast(bool, read("ZEROSERVE_CPU_KERNELS"))


_LOCAL_ENGINE_CURVE_VARS = (
    "ZEROSERVE_GATEWAY_CURVE_PUBLIC", "ZEROSERVE_ENGINE_CURVE_PUBLIC", "ZEROSERVE_ENGINE_CURVE_SECRET"
)


def local_engine_curve_env(gateway_public: str, engine_public: str, engine_secret: str) -> dict[str, str]:
    """The variables that hand a gateway's local engine its CURVE identity (Z85 keys)."""
    return dict(zip(_LOCAL_ENGINE_CURVE_VARS, (gateway_public, engine_public, engine_secret), strict=True))


def local_engine_curve_keys() -> tuple[str, str, str] | None:
    """(gateway public, engine public, engine secret) as `local_engine_curve_env` set them, or None."""
    gateway_public, engine_public, engine_secret = (read(name) for name in _LOCAL_ENGINE_CURVE_VARS)
    return (gateway_public, engine_public, engine_secret) if engine_secret else None


FLAG_VAR_PREFIX = "ZEROSERVE_"


def flag_var_name(action: argparse.Action) -> str:
    """ZEROSERVE_MAX_NUM_SEQS for `--max-num-seqs`; ZEROSERVE_MODEL for the positional `model`."""
    return FLAG_VAR_PREFIX + _flag_name(action).lstrip("-").replace("-", "_").upper()


def flag_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags (and positionals) that have a variable: all but help and internal (hidden) ones."""
    return [
        action for action in parser._actions
        if action.help != argparse.SUPPRESS
        and not isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
    ]


def document_flag_vars(parser: argparse.ArgumentParser) -> None:
    """Ends each flag's --help line with its default and its variable."""
    for action in flag_actions(parser):
        text = action.help or ""
        if "default:" not in text:
            text = f"{text} (default: %(default)s)"
        action.help = f"{text} [env: {flag_var_name(action)}]".strip()


def flag_defaults_from_env(parser: argparse.ArgumentParser, environ: Mapping[str, str]) -> dict[str, Any]:
    """The defaults ZEROSERVE_<FLAG> variables give `parser`'s flags; a bad value raises
    ValueError naming the variable. Lists (`--api-key`, `--served-model-name`) are comma-separated."""
    defaults: dict[str, Any] = {}
    for action in flag_actions(parser):
        name = flag_var_name(action)
        raw = environ.get(name)
        if raw is None:
            continue
        try:
            defaults[action.dest] = _flag_value(action, raw)
        except (ValueError, TypeError, argparse.ArgumentTypeError) as exc:
            flag = _flag_name(action)
            raise ValueError(f"Bad value {raw!r} for environment variable {name} ({flag}): {exc}") from exc
    return defaults


def naming_the_variable(message: str, argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """A message about `--flag ...`, naming the variable that set the flag when `argv` did not."""
    flag = message.split(" ", 1)[0].rstrip(":")
    if not flag.startswith("--"):
        return message
    name = FLAG_VAR_PREFIX + flag[2:].replace("-", "_").upper()
    if name in environ and not any(arg == flag or arg.startswith(f"{flag}=") for arg in argv):
        return f"{message} (set by environment variable {name})"
    return message


def _flag_name(action: argparse.Action) -> str:
    """`--enable-prefix-caching` (not `--no-enable-prefix-caching`, nor a short `-p`), or a positional's name."""
    return next((option for option in action.option_strings if option.startswith("--")), action.dest)


def _flag_value(action: argparse.Action, raw: str) -> Any:
    if isinstance(action, argparse.BooleanOptionalAction):
        return _bool(raw)
    if action.nargs == 0:
        return action.const if _bool(raw) else action.default
    if isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*"):
        values = [_one_flag_value(action, part.strip()) for part in raw.split(",") if part.strip()]
        if not values:
            raise ValueError("must list at least one value, comma-separated")
        return values
    return _one_flag_value(action, raw)


def _one_flag_value(action: argparse.Action, raw: str) -> Any:
    convert: Callable[[str], Any] = action.type if callable(action.type) else str
    value = convert(raw)
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"must be one of {', '.join(map(str, action.choices))}")
    return value
