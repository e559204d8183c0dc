"""Gemma 3 decoder over a flat batch of tokens: the Llama family's norms, projections and rotary, arranged
as Gemma arranges them.

What differs from Llama (llama.py): the embedding is scaled by sqrt(hidden_size); each block norms its
input and its output, around attention and around the MLP (four norms a layer); queries and keys are
normed per head; the MLP gates with GELU (tanh); local layers attend to the last `sliding_window`
tokens with their own rotary base, every sixth layer is global. Norm weights are held as (1 + w), the
form llama.cpp's GGUFs store and Gemma's RMSNorm multiplies by (loader adds 1 to a folder's).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine_proc.cpu.quantized_linear import Linear
from engine_proc.models.attention_api import AttentionBackend
from engine_proc.models.config import ModelConfig
from engine_proc.models.family import Family, Fields, MetadataReader
from engine_proc.models.hf_config import rope
from engine_proc.models.llama import LlamaForCausalLM, RMSNorm, RotaryEmbedding, RotaryRows, RowEmbedding, apply_rotary


class Gemma3Attention(nn.Module):
    """Fused QKV projection, per-head q/k norms, rotary, backend attention (windowed on local layers)."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_sliding = bool(config.sliding_layers) and config.sliding_layers[layer_idx]
        self.qkv_proj = Linear(config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.attention_bias)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        # NOTE: the backend scales by head_dim ** -0.5; Gemma by query_pre_attn_scalar ** -0.5.
        scalar = config.query_pre_attn_scalar or config.head_dim
        self.query_scale = None if scalar == config.head_dim else (config.head_dim / scalar) ** 0.5

    def forward(self, hidden: Tensor, rotary: RotaryRows, attn: AttentionBackend) -> Tensor:
        config = self.config
        num_tokens, num_heads = hidden.shape[0], config.num_attention_heads
        qkv = self.qkv_proj(hidden)
        query_key = qkv[:, : config.q_size + config.kv_size].view(num_tokens, -1, config.head_dim)
        value = qkv[:, config.q_size + config.kv_size :].view(num_tokens, -1, config.head_dim)
        query_key = torch.cat((self.q_norm(query_key[:, :num_heads]), self.k_norm(query_key[:, num_heads:])), dim=1)
        query_key = apply_rotary(query_key, rotary.cos, rotary.sin)
        query, key = query_key[:, :num_heads], query_key[:, num_heads:]
        if self.query_scale is not None:
            query = query * self.query_scale
        window = config.sliding_window if self.is_sliding else None
        out = attn.forward(self.layer_idx, query, key, value, window=window)
        return self.o_proj(out.reshape(num_tokens, config.q_size))


class Gemma3MLP(nn.Module):
    """GELU (tanh) gated feed-forward, gate and up projections fused."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh").mul_(up))


class Gemma3DecoderLayer(nn.Module):
    """Normed attention, normed again, added; normed MLP, normed again, added."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.is_sliding = bool(config.sliding_layers) and config.sliding_layers[layer_idx]
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Gemma3Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Gemma3MLP(config)
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, hidden: Tensor, rotary: RotaryRows, attn: AttentionBackend) -> Tensor:
        attended = self.post_attention_layernorm(self.self_attn(self.input_layernorm(hidden), rotary, attn))
        hidden = hidden + attended
        return hidden + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(hidden)))


class Gemma3Model(nn.Module):
    """Embedding, decoder layers and final norm (Hugging Face's `model.` prefix), with a rotary table for
    the global layers and one for the local ones."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(
            config.vocab_size, config.hidden_size, _weight=torch.empty(config.vocab_size, config.hidden_size)
        )
        self.rotary_emb = RotaryEmbedding(config)
        local = dataclasses.replace(config, rope_theta=config.local_rope_theta or config.rope_theta, rope_scaling=None)
        self.local_rotary_emb = RotaryEmbedding(local)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.embed_rows: RowEmbedding | None = None


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 (text): its decoder, the Llama family's output head and matmul forms."""

    model_class = Gemma3Model

    def forward(self, input_ids: Tensor, positions: Tensor, attn: AttentionBackend) -> Tensor:
        """Final-normed hidden states [num_tokens, hidden_size] for the tokens of several sequences."""
        model = self.model
        assert isinstance(model, Gemma3Model)
        hidden = (model.embed_rows or model.embed_tokens)(input_ids)
        # NOTE: as Hugging Face's: the scale rounded to the embedding's dtype, then multiplied.
        hidden = hidden * torch.tensor(self.config.hidden_size**0.5, dtype=hidden.dtype)
        rotary, local_rotary = model.rotary_emb(positions), model.local_rotary_emb(positions)
        for layer in model.layers:
            hidden = layer(hidden, local_rotary if layer.is_sliding else rotary, attn)
        return model.norm(hidden)


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    """Gemma 3's text config: local (sliding) and global layers, each kind with its own rotary parameters."""
    if raw.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"unsupported hidden_activation {raw['hidden_activation']!r}; only 'gelu_pytorch_tanh' is")
    if raw.get("final_logit_softcapping") or raw.get("attn_logit_softcapping"):
        raise ValueError("logit soft-capping (Gemma 2) is not supported")
    num_layers = raw["num_hidden_layers"]
    pattern = raw.get("sliding_window_pattern", 6)
    layer_types = raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
    ]
    parameters = raw.get("rope_parameters") or {}
    full = dict(parameters.get("full_attention") or {"rope_theta": raw.get("rope_theta", 1_000_000.0),
                                                        **(raw.get("rope_scaling") or {})})
    local = parameters.get("sliding_attention") or {"rope_theta": raw.get("rope_local_base_freq", 10_000.0)}
    rope_theta, rope_scaling = rope({"rope_parameters": full})
    return {
        **fields,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": raw.get("max_position_embeddings", 131072),
        "tie_word_embeddings": bool(raw.get("tie_word_embeddings", True)),
        "qk_norm": True,
        "hidden_act": "gelu_tanh",
        "sliding_window": raw.get("sliding_window"),
        "sliding_layers": tuple(kind == "sliding_attention" for kind in layer_types),
        "local_rope_theta": float(local.get("rope_theta", 10_000.0)),
        "query_pre_attn_scalar": float(raw.get("query_pre_attn_scalar") or raw.get("head_dim") or 256),
    }


# NOTE: llama.cpp's Gemma 3: every sixth layer global unless the file says, local layers' rotary base.
_GGUF_PATTERN, _GGUF_LOCAL_ROPE_THETA = 6, 10_000.0


def _gguf_config(read: MetadataReader, fields: Fields) -> Fields:
    """Gemma 3's local and global layers, their rotary bases and its attention scale, as llama.cpp reads them."""
    window = int(read("attention.sliding_window", 0))
    pattern = read("attention.sliding_window_pattern", _GGUF_PATTERN)
    num_layers = fields["num_hidden_layers"]
    if isinstance(pattern, list):
        sliding = tuple(bool(is_sliding) for is_sliding in pattern)
    else:
        sliding = tuple(i % int(pattern) < int(pattern) - 1 for i in range(num_layers))
    # NOTE: llama.cpp: 1/sqrt(head_dim), but 1/sqrt(hidden / heads) for the 62-layer (27B) model.
    is_27b = num_layers == 62
    hidden_size, num_heads = fields["hidden_size"], fields["num_attention_heads"]
    return {
        **fields,
        "hidden_act": "gelu_tanh",
        "sliding_window": window or None,
        "sliding_layers": sliding if window else (),
        "local_rope_theta": float(read("rope.freq_base_swa", _GGUF_LOCAL_ROPE_THETA)),
        "query_pre_attn_scalar": float(hidden_size // num_heads if is_27b else fields["head_dim"]),
    }


FAMILY = Family(
    "gemma3", Gemma3ForCausalLM, hf_model_types=("gemma3_text",), gguf_architectures=("gemma3",),
    hf_config=_hf_config, gguf_config=_gguf_config, is_norm_shifted=True,
    gguf_layer_names={
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
)
