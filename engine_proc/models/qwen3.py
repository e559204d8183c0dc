"""Qwen3: the Llama decoder with per-head RMS norms of queries and keys before the rotary embedding."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_proc.models.family import Family, Fields
from engine_proc.models.llama import LlamaForCausalLM


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    return {**fields, "qk_norm": True}


FAMILY = Family("qwen3", LlamaForCausalLM, hf_model_types=("qwen3",), gguf_architectures=("qwen3",), hf_config=_hf_config)
