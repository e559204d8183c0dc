"""The model class of each architecture: one module a family, sharing the layers they have in common."""

from __future__ import annotations

from engine_proc.models.config import ModelConfig
from engine_proc.models.gemma3 import Gemma3ForCausalLM
from engine_proc.models.llama import LlamaForCausalLM, RotaryEmbedding

# NOTE: every other architecture (Llama, Mistral, Qwen2, Qwen3, Phi-3) runs llama.py's decoder.
_FAMILIES: dict[str, type[LlamaForCausalLM]] = {"gemma3": Gemma3ForCausalLM}


def model_class(config: ModelConfig) -> type[LlamaForCausalLM]:
    """The class that runs `config`'s architecture."""
    return _FAMILIES.get(config.architecture, LlamaForCausalLM)


def reset_rotary_tables(model: LlamaForCausalLM) -> None:
    """Fills every rotary table of the model (after its buffers were moved or emptied)."""
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_cache()
