"""A cacheless attention backend for tests: causal attention within each sequence of a flat batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine_proc.models.attention_api import DecodeStep, HeadNorms


def dense_attention(
    query: Tensor, key: Tensor, value: Tensor, num_context: int = 0, window: int | None = None, sinks: Tensor | None = None
) -> Tensor:
    """One sequence's queries [n, H, D] at positions num_context.. over its keys/values [num_context + n, KVH, D],
    causal; with a `window`, each over the keys of its last `window` positions only; with `sinks` [H], as
    transformers' GptOss eager attention: each head's sink logit concatenated to its scores as one more column,
    softmax, the column dropped."""
    num_queries_per_kv = query.shape[1] // key.shape[1]
    # [tokens, heads, dim] -> [heads, tokens, dim], the KV heads repeated for their query heads.
    q = query.transpose(0, 1)
    k, v = (x.repeat_interleave(num_queries_per_kv, dim=1).transpose(0, 1) for x in (key, value))
    positions = torch.arange(num_context, num_context + query.shape[0])
    distance = positions[:, None] - torch.arange(key.shape[0])[None, :]
    is_seen = (distance >= 0) & (distance < (window or key.shape[0] + 1))
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=is_seen).transpose(0, 1)
    scores = torch.matmul(q, k.transpose(1, 2)) * query.shape[-1] ** -0.5
    scores = scores.masked_fill(~is_seen, float("-inf"))
    logits = torch.cat((scores, sinks.to(scores.dtype).view(-1, 1, 1).expand(-1, query.shape[0], 1)), dim=-1)
    logits = logits - logits.max(dim=-1, keepdim=True).values
    probs = logits.softmax(dim=-1)[..., :-1]
    return torch.matmul(probs, v).transpose(0, 1)


class DenseCausalAttention:
    """Attends causally inside each of the concatenated sequences (lengths given), no KV cache."""

    def __init__(self, seq_lens: list[int]) -> None:
        self.seq_lens = seq_lens

    def rotate_and_store(
        self, layer_idx: int, qkv: Tensor, rotary_table: Tensor, head_norms: HeadNorms | None = None
    ) -> tuple[Tensor, Tensor] | None:
        return None  # nothing to store: the model rotates

    def decode_step(self, group: int) -> DecodeStep | None:
        return None  # no cache: the model runs its layers one by one

    def forward(
        self, layer_idx: int, query: Tensor, key: Tensor, value: Tensor, is_stored: bool = False,
        window: int | None = None, sinks: Tensor | None = None,
    ) -> Tensor:
        if sum(self.seq_lens) != query.shape[0]:
            raise ValueError(f"sequence lengths {self.seq_lens} do not add up to {query.shape[0]} tokens")
        return torch.cat([
            dense_attention(q, k, v, window=window, sinks=sinks)
            for q, k, v in zip(*(x.split(self.seq_lens) for x in (query, key, value)), strict=True)
        ])
