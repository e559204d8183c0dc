"""Model resolution: names, GGUF paths, Hugging Face folders, and the fetch cache."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proto import envs
from service.model_files.model_registry import DEFAULT_MODEL, KNOWN_MODELS, resolve_model
from tests.small_model_files import write_gguf, write_hf_folder


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """ZEROSERVE_CACHE pointed at an empty folder for one test."""
    monkeypatch.setenv("ZEROSERVE_CACHE", str(tmp_path / "cache"))
    envs.read.cache_clear()
    yield tmp_path / "cache"
    envs.read.cache_clear()


def test_gguf_path_is_served_under_its_stem(tmp_path: Path) -> None:
    path = tmp_path / "tiny-model.Q8_0.gguf"
    write_gguf(path)
    resolved = resolve_model(str(path))
    assert (resolved.name, resolved.path, resolved.kind) == ("tiny-model.Q8_0", path, "gguf")


def test_a_gguf_takes_the_sampling_defaults_of_a_generation_config_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "tiny-model.Q8_0.gguf"
    write_gguf(path)
    (tmp_path / "generation_config.json").write_text('{"do_sample": true, "temperature": 0.6, "top_p": 0.9}')
    assert resolve_model(str(path)).generation_defaults == {"temperature": 0.6, "top_p": 0.9}


@pytest.mark.real_model
def test_a_known_models_file_by_path_is_the_known_model_under_any_file_name(
    default_model_path: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(default_model_path, copy)
    by_name = resolve_model(DEFAULT_MODEL)
    for path in (default_model_path, copy):
        resolved = resolve_model(str(path))
        assert (resolved.name, resolved.path, resolved.generation_defaults) == (DEFAULT_MODEL, path, by_name.generation_defaults)
    # NOTE: the same size, one byte changed: another file.
    with copy.open("r+b") as file:
        file.seek(-1, 2)
        last = file.read(1)
        file.seek(-1, 2)
        file.write(bytes([last[0] ^ 1]))
    assert copy.stat().st_size == default_model_path.stat().st_size
    assert resolve_model(str(copy)).name == "renamed"


def test_hf_folder_is_served_under_its_name(tmp_path: Path) -> None:
    folder = write_hf_folder(tmp_path / "my-model")
    resolved = resolve_model(str(folder))
    assert (resolved.name, resolved.path, resolved.kind) == ("my-model", folder, "hf")


@pytest.mark.parametrize("name", ["no-such-model", "/nonexistent/model.gguf", "."])
def test_unknown_name_lists_known_names(name: str) -> None:
    with pytest.raises(ValueError, match=DEFAULT_MODEL):
        resolve_model(name)


@pytest.mark.parametrize("name", ["/nonexistent/model.gguf", "model.gguf", "models/smollm2"])
def test_a_missing_path_is_no_such_file(name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}: no such file or folder "):
        resolve_model(name)


@pytest.mark.real_model
def test_known_name_reuses_cached_file(
    cache: Path, default_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = KNOWN_MODELS[DEFAULT_MODEL]
    cached = cache / "models" / DEFAULT_MODEL / known.filename
    cached.parent.mkdir(parents=True)
    shutil.copyfile(default_model_path, cached)

    def no_network(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("resolve_model ran a subprocess for a cached model")

    monkeypatch.setattr(subprocess, "run", no_network)
    resolved = resolve_model(DEFAULT_MODEL)
    assert (resolved.name, resolved.path, resolved.kind) == (DEFAULT_MODEL, cached, "gguf")


@pytest.mark.real_model
def test_default_model_is_a_gguf(default_model_path: Path) -> None:
    assert default_model_path.read_bytes()[:4] == b"GGUF"
