"""SmolLM3: the Llama decoder, every fourth layer attending without rotary embeddings (NoPE); llama.cpp's
converter permutes its GGUF Q/K rows as the llama architecture's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_proc.models.family import Family, Fields, MetadataReader
from engine_proc.models.hf_config import opt_in_window
from engine_proc.models.llama import LlamaForCausalLM

_NO_ROPE_INTERVAL = 4  # as llama.cpp's `n_no_rope_layer_step` and transformers' default


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    num_layers = fields["num_hidden_layers"]
    interval = raw.get("no_rope_layer_interval", _NO_ROPE_INTERVAL)
    # NOTE: transformers' `no_rope_layers` holds 1 where a layer uses rotary embeddings.
    uses_rope = raw.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(num_layers)]
    return opt_in_window(raw, {**fields, "no_rope_layers": tuple(not use for use in uses_rope[:num_layers])})


def _gguf_config(read: MetadataReader, fields: Fields) -> Fields:
    num_layers = fields["num_hidden_layers"]
    return {**fields, "no_rope_layers": tuple((i + 1) % _NO_ROPE_INTERVAL == 0 for i in range(num_layers))}


FAMILY = Family(
    "smollm3", LlamaForCausalLM, hf_model_types=("smollm3",), gguf_architectures=("smollm3",),
    hf_config=_hf_config, gguf_config=_gguf_config, is_gguf_permuted=True,
)
