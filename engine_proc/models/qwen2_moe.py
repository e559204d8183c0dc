"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention (Q/K/V biases), every layer's feed-forward a
mixture of experts (weights not renormalised) beside a shared expert that every token runs, weighted by
the sigmoid of its own gate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_proc.models.family import Family, Fields, MetadataReader
from engine_proc.models.hf_config import opt_in_window
from engine_proc.models.llama import LlamaForCausalLM
from engine_proc.models.moe import gguf_expert_fields, hf_expert_fields


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    return hf_expert_fields(raw, opt_in_window(raw, {**fields, "attention_bias": True}))


def _gguf_config(read: MetadataReader, fields: Fields) -> Fields:
    return gguf_expert_fields(read, fields, is_renormalised=False)


FAMILY = Family(
    "qwen2_moe", LlamaForCausalLM, hf_model_types=("qwen2_moe",), gguf_architectures=("qwen2moe",),
    hf_config=_hf_config, gguf_config=_gguf_config, has_experts=True,
)
