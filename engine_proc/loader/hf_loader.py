"""Load a Hugging Face model directory: config.json, generation_config.json and *.safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor

from engine_proc.models.config import ModelConfig
from engine_proc.models.family import FolderTensor
from engine_proc.models.hf_config import common_fields
from engine_proc.models.registry import family_of, hf_family
from proto.model_support import HF_MODEL_TYPES


def load_hf_config(path: str | Path) -> ModelConfig:
    """Read the model config (and EOS ids from generation_config.json) of a Hugging Face directory."""
    root = Path(path)
    raw = _read_json(root / "config.json")
    if raw is None:
        raise FileNotFoundError(f"{root} has no config.json")
    generation = _read_json(root / "generation_config.json") or {}
    return config_from_hf(raw, generation)


def load_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, FolderTensor]]:
    """Config and all safetensors tensors (sharded or not) of a Hugging Face directory, as the model's (see
    Family.hf_tensors)."""
    root = Path(path)
    config = load_hf_config(root)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{root} has no *.safetensors files")
    weights: dict[str, Tensor] = {}
    for file in files:
        shard = load_file(file)
        duplicated = weights.keys() & shard.keys()
        if duplicated:
            raise ValueError(f"{file.name} repeats tensors already loaded: {sorted(duplicated)[:5]}")
        weights.update(shard)
    family = family_of(config.architecture)
    if family.is_norm_shifted:
        # NOTE: Gemma's RMSNorm multiplies by (1 + w); the model holds (1 + w), as llama.cpp's GGUFs do.
        weights.update({name: t.float() + 1 for name, t in weights.items() if name.endswith("norm.weight")})
    return config, family.hf_tensors({family.hf_name(name): tensor for name, tensor in weights.items()})


def hf_tensor_names(path: str | Path) -> set[str]:
    """The model's names of the tensors in a Hugging Face directory's safetensors files, read from their headers."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors files")
    family = family_of(load_hf_config(path).architecture)
    # NOTE: each tensor as a meta tensor of its shape, so the family's `hf_tensors` names what it makes of them.
    shapes: dict[str, Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt") as shard:
            shapes.update({
                family.hf_name(name): torch.empty(shard.get_slice(name).get_shape(), device="meta") for name in shard.keys()
            })
    return set(family.hf_tensors(shapes))


def config_from_hf(raw: dict[str, Any], generation: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from parsed config.json and generation_config.json contents: the fields every
    family reads alike, then its own (Family.hf_config)."""
    family = hf_family(raw.get("model_type", ""))
    if family is None:
        raise ValueError(f"unsupported model_type {raw.get('model_type')!r}; supported: {', '.join(HF_MODEL_TYPES)}")
    return ModelConfig(architecture=family.architecture, **family.hf_config(raw, common_fields(raw, generation)))


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as file:
        data: dict[str, Any] = json.load(file)
    return data
