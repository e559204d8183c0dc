"""Mixtral: the Llama decoder, every layer's feed-forward 8 experts of which 2 run (their weights renormalised);
llama.cpp's files name it `llama` with expert tensors, its folders name the experts `w1`, `w3`, `w2`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_proc.models.family import Family, Fields, MetadataReader
from engine_proc.models.llama import LlamaForCausalLM
from engine_proc.models.moe import gguf_expert_fields, hf_expert_fields


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    return hf_expert_fields(raw, fields, is_renormalised=True)


def _gguf_config(read: MetadataReader, fields: Fields) -> Fields:
    return gguf_expert_fields(read, fields, is_renormalised=True)


FAMILY = Family(
    "mixtral", LlamaForCausalLM, hf_model_types=("mixtral",), gguf_architectures=("llama",),
    hf_config=_hf_config, gguf_config=_gguf_config, is_gguf_permuted=True, has_experts=True,
    hf_renames=((".block_sparse_moe.", ".mlp."), (".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj.")),
)
