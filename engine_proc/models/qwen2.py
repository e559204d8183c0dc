"""Qwen2 (and Qwen2.5): the Llama decoder with biases on the Q/K/V projection; a folder's sliding window
applies only where `use_sliding_window` turns it on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_proc.models.family import Family, Fields
from engine_proc.models.hf_config import opt_in_window
from engine_proc.models.llama import LlamaForCausalLM


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    return opt_in_window(raw, {**fields, "attention_bias": True})


FAMILY = Family("qwen2", LlamaForCausalLM, hf_model_types=("qwen2",), gguf_architectures=("qwen2",), hf_config=_hf_config)
