"""What zeroserve serves, and the one-line refusal of a model file or folder it cannot.

The gateway checks a model here before any engine starts (`zeroserve serve`, `zeroserve
generate`, `LLM(...)`); the engine's loader reads the same lists, so both agree.
"""

from __future__ import annotations

import json
from pathlib import Path

from gguf import GGMLQuantizationType

from proto.gguf_header import read_gguf_header

# GGUF `general.architecture` names the engine runs
GGUF_ARCHITECTURES = ("gemma3", "llama", "phi3", "qwen2", "qwen3")
# Hugging Face `model_type` names the engine runs
HF_MODEL_TYPES = ("gemma3_text", "llama", "mistral", "phi3", "qwen2", "qwen3")
# the engine's name of a model_type, where the two differ
HF_ARCHITECTURES = {"gemma3_text": "gemma3"}
# the architectures the engine's model code knows
ARCHITECTURES = tuple(sorted({*GGUF_ARCHITECTURES, *(HF_ARCHITECTURES.get(t, t) for t in HF_MODEL_TYPES)}))
# NOTE: architectures whose checkpoints hold Q/K/V and gate/up fused, as the model runs them
FUSED_CHECKPOINTS = frozenset({"phi3"})
GGML_TYPES = frozenset(GGMLQuantizationType)
# `tokenizer.ggml.model` values proto/gguf_tokenizer.py rebuilds (NOTE: declared here, where the engine
# reads these lists without loading the tokenizer library)
TOKENIZER_MODELS = ("gpt2", "llama", "gemma4")
_ROPE_TYPES = "default, linear, llama3"


class UnsupportedModel(ValueError):
    """A model file or folder zeroserve cannot serve; its message is one line naming what and why."""


def check_servable(path: Path) -> None:
    """Raises UnsupportedModel naming the first thing of this `.gguf` file or Hugging Face folder that
    zeroserve cannot serve (architecture, tokenizer, tensor type), with what it supports instead."""
    if path.is_file():
        _check_gguf(path)
    else:
        _check_hf_folder(path)


def _check_gguf(path: Path) -> None:
    try:
        header = read_gguf_header(path)
    except ValueError as exc:
        raise UnsupportedModel(f"{path.name} is not a readable GGUF file: {exc}") from None
    metadata = header.metadata
    architecture = metadata.get("general.architecture")
    if architecture not in GGUF_ARCHITECTURES:
        raise UnsupportedModel(
            f"{path.name}: architecture {architecture!r} is not supported; supported: {', '.join(GGUF_ARCHITECTURES)}"
        )
    tokenizer = metadata.get("tokenizer.ggml.model")
    if tokenizer not in TOKENIZER_MODELS:
        raise UnsupportedModel(
            f"{path.name}: tokenizer {tokenizer!r} is not supported; supported: {', '.join(TOKENIZER_MODELS)}"
        )
    unknown = next((tensor for tensor in header.tensors if tensor.ggml_type not in GGML_TYPES), None)
    if unknown is not None:
        known = ", ".join(ggml_type.name for ggml_type in GGMLQuantizationType)
        raise UnsupportedModel(
            f"{path.name}: tensor {unknown.name!r} has ggml type {unknown.ggml_type}, which is not supported; "
            f"supported: {known}"
        )
    if any(tensor.name.startswith("rope_factors_") for tensor in header.tensors):
        raise UnsupportedModel(f"{path.name}: rope scaling 'longrope' is not supported; supported: {_ROPE_TYPES}")
    if not header.tensors:
        raise UnsupportedModel(f"{path.name} holds no tensors (a vocabulary-only GGUF); a model file has its weights")


def _check_hf_folder(path: Path) -> None:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"{path.name}: config.json could not be read: {exc}") from None
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES:
        raise UnsupportedModel(
            f"{path.name}: model_type {model_type!r} is not supported; supported: {', '.join(HF_MODEL_TYPES)}"
        )
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in _ROPE_TYPES:
        raise UnsupportedModel(f"{path.name}: rope scaling {rope_type!r} is not supported; supported: {_ROPE_TYPES}")
    if not (path / "tokenizer.json").is_file():
        raise UnsupportedModel(
            f"{path.name} has no tokenizer.json; supported: a folder with tokenizer.json (the fast tokenizer)"
        )
    if not any(path.glob("*.safetensors")):
        raise UnsupportedModel(f"{path.name} has no *.safetensors weights; supported: safetensors files")
