"""Environment variables: defaults, overrides, loud failures, and every one named in the tree declared."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from proto import envs
from service.cli.main import _subparser, build_parser

ROOT = Path(__file__).resolve().parent.parent.parent
SEARCHED = ("proto", "engine_proc", "service", "benchmarks", "deploy", "README.md")
# NOTE: C preprocessor names (`-DZEROSERVE_AMX`, `#ifdef ZEROSERVE_AMX`) are no environment variables.
NAME = re.compile(r"(?<!-D)(?<!#ifdef )(?<!#if )\bZEROSERVE_[A-Z0-9_]*[A-Z0-9]\b")


@pytest.fixture(autouse=True)
def fresh_env() -> Iterator[None]:
    envs.read.cache_clear()
    yield
    envs.read.cache_clear()


def test_cache_dir_defaults_to_home_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEROSERVE_CACHE", raising=False)
    assert envs.cache_dir() == Path.home() / ".cache" / "zeroserve"


def test_cache_dir_follows_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZEROSERVE_CACHE", str(tmp_path))
    assert envs.cache_dir() == tmp_path


def test_bad_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROSERVE_CACHE", "  ")
    with pytest.raises(ValueError, match="ZEROSERVE_CACHE"):
        envs.cache_dir()


@pytest.mark.parametrize(("value", "expected"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_cpu_kernels_switch(value: str | None, expected: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv("ZEROSERVE_CPU_KERNELS", raising=False)
    else:
        monkeypatch.setenv("ZEROSERVE_CPU_KERNELS", value)
    assert envs.cpu_kernels() is expected


def test_a_bad_switch_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEROSERVE_CPU_KERNELS", "maybe")
    with pytest.raises(ValueError, match="ZEROSERVE_CPU_KERNELS"):
        envs.cpu_kernels()


def test_a_local_engine_reads_the_curve_keys_its_gateway_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in envs.local_engine_curve_env("", "", ""):
        monkeypatch.delenv(name, raising=False)
    assert envs.local_engine_curve_keys() is None
    for name, value in envs.local_engine_curve_env("gateway", "public", "secret").items():
        monkeypatch.setenv(name, value)
    envs.read.cache_clear()
    assert envs.local_engine_curve_keys() == ("gateway", "public", "secret")


def named_variables() -> dict[str, set[str]]:
    """Every ZEROSERVE_ name in the searched files, with the files naming it."""
    found: dict[str, set[str]] = {}
    for top in SEARCHED:
        paths = [ROOT / top] if (ROOT / top).is_file() else (ROOT / top).rglob("*")
        for path in paths:
            if path.is_file() and path.suffix not in {".cpp", ".h", ".pyc", ".so"}:
                for name in NAME.findall(path.read_text(errors="replace")):
                    found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_variable_named_in_the_tree_is_declared() -> None:
    serve = _subparser(build_parser(), "serve")
    flag_vars = {envs.flag_var_name(action) for action in envs.flag_actions(serve)}
    named = named_variables()
    assert {"ZEROSERVE_CPU_KERNELS", "ZEROSERVE_CACHE", "ZEROSERVE_MAX_NUM_SEQS"} <= set(named)
    undeclared = {name: files for name, files in named.items() if name not in envs.ENV_VARS.keys() | flag_vars}
    assert not undeclared
    assert not envs.ENV_VARS.keys() & flag_vars


def test_only_the_one_module_reads_the_environment() -> None:
    """Elsewhere the environment is only passed on whole (to a child process, or to this module)."""
    reads = re.compile(r"os\.environ\s*\[|os\.environ\.get|getenv|in os\.environ")
    readers = [
        str(path.relative_to(ROOT)) for top in ("proto", "engine_proc", "service") for path in (ROOT / top).rglob("*.py")
        if path != ROOT / "proto" / "envs.py" and reads.search(path.read_text())
    ]
    assert not readers
