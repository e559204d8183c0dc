"""Environment variables: defaults, overrides, and loud failures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from service import envs


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
