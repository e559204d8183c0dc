"""What zeroserve serves, and the one-line refusal of a model file or folder it cannot.

The gateway checks a model here before any engine starts (`zeroserve serve`, `zeroserve
generate`, `LLM(...)`); the engine's loader reads the same lists, so both agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gguf import GGMLQuantizationType

from proto.gguf_header import read_gguf_header

# NOTE: these lists are the engine's registry (engine_proc/models/registry.py) as the gateway reads it without
# importing the engine, held equal to it by tests/engine_proc/models/test_registry.py.
# GGUF `general.architecture` names the engine runs
GGUF_ARCHITECTURES = ("gemma3", "gpt-oss", "llama", "olmoe", "phi3", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "smollm3")
# Hugging Face `model_type` names the engine runs
HF_MODEL_TYPES = (
    "gemma3_text", "gpt_oss", "llama", "mistral", "mixtral", "olmoe", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "smollm3",
)
# encoders: models that embed texts or score pairs of them (a pooling runner), never generate
ENCODER_MODEL_TYPES = ("bert",)
# the engine's names of its architectures (ModelConfig.architecture)
ARCHITECTURES = (
    "gemma3", "gpt_oss", "llama", "mistral", "mixtral", "olmoe", "phi3", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "smollm3",
)
# ggml tensor types the engine's loader reads: those its kernel forms take as blocks (Q4_0, Q4_1, Q5_0, Q5_1,
# Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4), the float ones, and those it converts with gguf-py's dequantize (NOTE: held
# equal to what engine_proc/loader/gguf_loader.py reads by tests/engine_proc/loader/test_gguf_loader.py)
GGML_TYPES = frozenset(GGMLQuantizationType[name] for name in (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0",
    "MXFP4", "NVFP4",
))
# GGUF architectures and Hugging Face model_types whose mixture-of-experts layers the engine runs (NOTE: the
# one place a family lifts the refusal of expert tensors and expert configs)
MIXTURE_OF_EXPERTS_ARCHITECTURES = frozenset(
    {"gpt-oss", "gpt_oss", "llama", "mixtral", "olmoe", "qwen2_moe", "qwen2moe", "qwen3_moe", "qwen3moe"}
)
# `tokenizer.ggml.model` values proto/gguf_tokenizer.py rebuilds (NOTE: declared here, where the engine
# reads these lists without loading the tokenizer library)
TOKENIZER_MODELS = ("gpt2", "llama", "gemma4")
_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# GGUF `{arch}.rope.scaling.type` values the loader reads (llama3's comes as a `rope_freqs` tensor)
_GGUF_ROPE_SCALING_TYPES = ("none", "linear", "yarn")


class UnsupportedModel(ValueError):
    """A model file or folder zeroserve cannot serve; its message is one line naming what and why."""


def check_servable(path: Path) -> None:
    """Raises UnsupportedModel naming the first thing of this `.gguf` file or Hugging Face folder that
    zeroserve cannot serve (architecture, tokenizer, tensor type, experts, rope scaling), with what it supports
    instead, or what is wrong with the file (cut short, corrupt), reading none of its tensors' bytes."""
    if path.is_file():
        _check_gguf(path)
    else:
        _check_hf_folder(path)


def _check_gguf(path: Path) -> None:
    try:
        header = read_gguf_header(path)
    except OSError as exc:
        raise UnsupportedModel(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UnsupportedModel(str(exc)) from None
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
        raise UnsupportedModel(
            f"{path.name}: tensor {unknown.name!r} has ggml type {_type_name(unknown.ggml_type)}, which is not "
            f"supported; supported: {', '.join(sorted(ggml_type.name for ggml_type in GGML_TYPES))}"
        )
    has_expert_tensors = any("_exps." in tensor.name for tensor in header.tensors)
    _check_experts(path, architecture, metadata.get(f"{architecture}.expert_count") or has_expert_tensors)
    rope_scaling = metadata.get(f"{architecture}.rope.scaling.type", "none")
    if any(tensor.name.startswith("rope_factors_") for tensor in header.tensors):
        rope_scaling = "longrope"
    if rope_scaling not in _GGUF_ROPE_SCALING_TYPES:
        raise UnsupportedModel(
            f"{path.name}: rope scaling {rope_scaling!r} is not supported; supported: {', '.join(_ROPE_TYPES)}"
        )
    _check_rotary_dims(path, architecture, metadata)
    if not header.tensors:
        raise UnsupportedModel(f"{path.name} holds no tensors (a vocabulary-only GGUF); a model file has its weights")


def _check_rotary_dims(path: Path, architecture: str, metadata: dict[str, Any]) -> None:
    """Refuses rotary embeddings over part of a head (a head's size read as the loader reads it)."""
    hidden_size = metadata.get(f"{architecture}.embedding_length")
    num_heads = metadata.get(f"{architecture}.attention.head_count")
    head_dim = metadata.get(f"{architecture}.attention.key_length") or (
        hidden_size // num_heads if hidden_size and num_heads else None
    )
    rotary_dim = metadata.get(f"{architecture}.rope.dimension_count") or head_dim
    if head_dim and rotary_dim != head_dim:
        raise UnsupportedModel(
            f"{path.name}: partial rotary embeddings ({rotary_dim} of {head_dim} dims a head) are not supported; "
            "supported: rotary embeddings over every dim of a head"
        )


def _type_name(ggml_type: int) -> str:
    """"9 (Q8_1)" for a type gguf-py knows, "250" for one it does not."""
    try:
        return f"{ggml_type} ({GGMLQuantizationType(ggml_type).name})"
    except ValueError:
        return str(ggml_type)


def _check_experts(path: Path, architecture: str, num_experts: int | bool) -> None:
    """Refuses a model with mixture-of-experts layers (`num_experts`: their count, or True where only its
    tensors say so) unless its architecture runs them."""
    if num_experts and architecture not in MIXTURE_OF_EXPERTS_ARCHITECTURES:
        count = "" if num_experts is True else f" ({num_experts} experts)"
        raise UnsupportedModel(
            f"{path.name}: mixture-of-experts layers{count} are not supported for {architecture!r}; supported: "
            f"dense models, and experts in {', '.join(sorted(MIXTURE_OF_EXPERTS_ARCHITECTURES))}"
        )


def _check_hf_folder(path: Path) -> None:
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UnsupportedModel(f"{path.name}: config.json could not be read: {exc}") from None
    model_type = config.get("model_type")
    if model_type not in HF_MODEL_TYPES + ENCODER_MODEL_TYPES:
        supported = ", ".join(HF_MODEL_TYPES + ENCODER_MODEL_TYPES)
        raise UnsupportedModel(f"{path.name}: model_type {model_type!r} is not supported; supported: {supported}")
    num_experts = config.get("num_local_experts") or config.get("num_experts")
    _check_experts(path, model_type, num_experts)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in _ROPE_TYPES:
        raise UnsupportedModel(
            f"{path.name}: rope scaling {rope_type!r} is not supported; supported: {', '.join(_ROPE_TYPES)}"
        )
    if not (path / "tokenizer.json").is_file():
        raise UnsupportedModel(
            f"{path.name} has no tokenizer.json; supported: a folder with tokenizer.json (the fast tokenizer)"
        )
    if not any(path.glob("*.safetensors")):
        raise UnsupportedModel(f"{path.name} has no *.safetensors weights; supported: safetensors files")


def is_encoder_folder(path: Path) -> bool:
    """True for a Hugging Face folder whose config.json names an encoder (ENCODER_MODEL_TYPES)."""
    config_path = path / "config.json"
    if not path.is_dir() or not config_path.is_file():
        return False
    try:
        return json.loads(config_path.read_text(encoding="utf-8")).get("model_type") in ENCODER_MODEL_TYPES
    except ValueError:
        return False
