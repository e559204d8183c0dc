"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): Qwen3's attention, every layer's feed-forward a mixture of
experts (128, 8 chosen, their weights renormalised as llama.cpp always does for the architecture)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_proc.models.family import Family, Fields, MetadataReader
from engine_proc.models.hf_config import opt_in_window
from engine_proc.models.llama import LlamaForCausalLM
from engine_proc.models.moe import gguf_expert_fields, hf_expert_fields


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    return hf_expert_fields(raw, opt_in_window(raw, {**fields, "qk_norm": True}))


def _gguf_config(read: MetadataReader, fields: Fields) -> Fields:
    return gguf_expert_fields(read, fields, is_renormalised=True)


FAMILY = Family(
    "qwen3_moe", LlamaForCausalLM, hf_model_types=("qwen3_moe",), gguf_architectures=("qwen3moe",),
    hf_config=_hf_config, gguf_config=_gguf_config, has_experts=True,
)
