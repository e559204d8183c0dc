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


ENV_VARS: dict[str, EnvVar] = {
    var.name: var
    for var in (
        EnvVar(
            "ZEROSERVE_CACHE",
            "~/.cache/zeroserve",
            _path,
            "Where fetched models are kept.",
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
