"""Every architecture the engine runs, one line each: its family module declares the rest (family.Family).

proto/model_support.py's lists, which the gateway reads without importing the engine, are held equal to
this table by tests/engine_proc/models/test_registry.py.
"""

from __future__ import annotations

from typing import cast

from torch import nn

from engine_proc.models import (
    gemma3,
    gpt_oss,
    llama,
    mistral,
    mixtral,
    olmoe,
    phi3,
    qwen2,
    qwen2_moe,
    qwen3,
    qwen3_moe,
    smollm3,
)
from engine_proc.models.config import ModelConfig
from engine_proc.models.family import Family
from engine_proc.models.llama import LlamaForCausalLM, RotaryEmbedding

FAMILIES: dict[str, Family] = {family.architecture: family for family in (
    gemma3.FAMILY,
    gpt_oss.FAMILY,
    llama.FAMILY,
    mistral.FAMILY,
    mixtral.FAMILY,
    olmoe.FAMILY,
    phi3.FAMILY,
    qwen2.FAMILY,
    qwen2_moe.FAMILY,
    qwen3.FAMILY,
    qwen3_moe.FAMILY,
    smollm3.FAMILY,
)}


def family_of(architecture: str) -> Family:
    """The family of a config's `architecture`."""
    return FAMILIES[architecture]


def hf_family(model_type: str) -> Family | None:
    """The family of a folder's `model_type`; None for one the engine does not run."""
    return next((family for family in FAMILIES.values() if model_type in family.hf_model_types), None)


def gguf_family(architecture: str, has_experts: bool) -> Family | None:
    """The family of a GGUF's `general.architecture`: of those with that name, the one with expert layers
    where the file has them (llama.cpp's `llama` names both Llama and Mixtral); None where none is."""
    named = [family for family in FAMILIES.values() if architecture in family.gguf_architectures]
    return next((family for family in named if family.has_experts == has_experts), named[0] if named else None)


def model_class(config: ModelConfig) -> type[LlamaForCausalLM]:
    """The class that runs `config`'s architecture (LlamaForCausalLM or a family's subclass of it)."""
    return cast(type[LlamaForCausalLM], family_of(config.architecture).model_class)


def reset_rotary_tables(model: nn.Module) -> None:
    """Fills every rotary table of the model (after its buffers were moved or emptied)."""
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_cache()
