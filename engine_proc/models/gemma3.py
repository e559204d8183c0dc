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

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine_proc.models.attention_api import AttentionBackend
from engine_proc.models.config import ModelConfig
from engine_proc.models.llama import LlamaForCausalLM, RMSNorm, RotaryEmbedding, RotaryRows, RowEmbedding, apply_rotary
from engine_proc.models.quantized_linear import Linear


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
