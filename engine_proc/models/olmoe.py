"""OLMoE: the Llama decoder with RMS norms over the whole query and key projections, every layer's feed-forward
64 experts of which 8 run (their weights not renormalised)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_proc.models.family import Family, Fields, MetadataReader
from engine_proc.models.llama import LlamaForCausalLM
from engine_proc.models.moe import gguf_expert_fields, hf_expert_fields


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    if raw.get("clip_qkv") is not None:
        raise ValueError("clipped Q/K/V (clip_qkv) is not supported")
    return hf_expert_fields(raw, {**fields, "qk_norm": True, "is_qk_norm_per_head": False})


def _gguf_config(read: MetadataReader, fields: Fields) -> Fields:
    return gguf_expert_fields(read, {**fields, "is_qk_norm_per_head": False}, is_renormalised=False)


FAMILY = Family(
    "olmoe", LlamaForCausalLM, hf_model_types=("olmoe",), gguf_architectures=("olmoe",),
    hf_config=_hf_config, gguf_config=_gguf_config, has_experts=True,
)
