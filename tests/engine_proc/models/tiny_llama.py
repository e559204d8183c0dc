"""Tiny random Llama-family checkpoints (Hugging Face format) and a flat-batch run of our model on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers

from engine_proc.models.llama import LlamaForCausalLM
from tests.engine_proc.models.dense_attention import DenseCausalAttention

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
LLAMA3_ROPE = dict(
    rope_type="llama3",
    rope_theta=10000.0,
    factor=8.0,
    low_freq_factor=1.0,
    high_freq_factor=4.0,
    original_max_position_embeddings=32,
)
CHECKPOINTS: dict[str, tuple[type[Any], dict[str, Any]]] = {
    "llama": (transformers.LlamaConfig, {}),
    "llama-tied-llama3-rope": (
        transformers.LlamaConfig,
        dict(tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
    ),
    "llama-linear-rope": (
        transformers.LlamaConfig, dict(rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=2.0)),
    ),
    "llama-yarn-rope": (
        transformers.LlamaConfig,
        dict(rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)),
    ),
    "qwen2-qkv-bias": (transformers.Qwen2Config, {}),
    "qwen3-qk-norm": (transformers.Qwen3Config, dict(head_dim=32)),
}


def save_tiny_checkpoint(path: Path, kind: str) -> transformers.PreTrainedModel:
    """Save a tiny random Hugging Face model of this kind under path, and return it (eval, float32)."""
    config_class, extra = CHECKPOINTS[kind]
    config = config_class(**TINY, **extra, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        # NOTE: init leaves biases at 0 and norms at 1, which would hide loading mistakes.
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    model.save_pretrained(path)
    return model.eval()


def run(model: LlamaForCausalLM, seqs: list[torch.Tensor]) -> torch.Tensor:
    """Logits for every token of the sequences, run as one flat batch."""
    positions = torch.cat([torch.arange(len(seq)) for seq in seqs])
    attn = DenseCausalAttention([len(seq) for seq in seqs])
    return model.compute_logits(model(torch.cat(seqs), positions, attn))
