"""Every environment variable zeroserve reads, declared in one table and read once."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any


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


ENV_VARS: dict[str, EnvVar] = {
    var.name: var
    for var in (
        EnvVar(
            "ZEROSERVE_CACHE",
            "~/.cache/zeroserve",
            _path,
            "Where fetched models are kept.",
        ),
        EnvVar(
            "ZEROSERVE_ENABLE_MULTIPROCESSING",
            "1",
            _bool,
            "LLM/LLMEngine: run the engine in its own process (1) or in the caller's (0).",
        ),
        EnvVar(
            "ZEROSERVE_STATS_LOG_INTERVAL",
            "10",
            _non_negative_float,
            "Seconds between stats log lines (0: no stats log).",
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
    value: Path = read("ZEROSERVE_CACHE")
    return value


def enable_multiprocessing() -> bool:
    """Whether LLM/LLMEngine run the engine in its own process (ZEROSERVE_ENABLE_MULTIPROCESSING)."""
    value: bool = read("ZEROSERVE_ENABLE_MULTIPROCESSING")
    return value


def stats_log_interval() -> float:
    """Seconds between stats log lines; 0 turns the log off (ZEROSERVE_STATS_LOG_INTERVAL)."""
    value: float = read("ZEROSERVE_STATS_LOG_INTERVAL")
    return value
