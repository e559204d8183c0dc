"""Paged attention on a flat batch: K/V written through a slot mapping, read through block tables."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillSpan:
    """Query tokens `[start, start + num_tokens)` of one sequence with more than one new token."""

    start: int
    num_tokens: int
    context_slots: torch.Tensor  # [context_len] cache slots of all its tokens so far
    mask: torch.Tensor | None  # [num_tokens, context_len]; None when the span is the whole context


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each one attends to.

    The flat batch puts the single-token sequences (decodes) first, then the prefill spans.
    """

    slot_mapping: torch.Tensor  # [num_tokens]
    num_decodes: int
    decode_slots: torch.Tensor | None  # [num_decodes, max_context_len], padded with slot 0
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_context_len]; None if unpadded
    prefills: list[PrefillSpan]


class PagedAttention:
    """The model's attention backend: one K/V cache tensor per layer, shared by all requests."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        # NOTE: zeros, not empty: padded decode slots are read (then masked), and garbage
        # NaNs would leak through the zero attention weights.
        self.kv_caches = [
            torch.zeros(2, num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self.metadata: AttentionMetadata | None = None

    def forward(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> torch.Tensor:
        meta = self.metadata
        assert meta is not None, "attention metadata must be set before the forward"
        k_cache, v_cache = self.kv_caches[layer_idx]
        k_cache.index_copy_(0, meta.slot_mapping, key)
        v_cache.index_copy_(0, meta.slot_mapping, value)
        out = torch.empty_like(query)
        if meta.num_decodes:
            assert meta.decode_slots is not None
            out[: meta.num_decodes] = _decode_attention(
                query[: meta.num_decodes],
                k_cache[meta.decode_slots],
                v_cache[meta.decode_slots],
                meta.decode_mask,
            )
        for span in meta.prefills:
            end = span.start + span.num_tokens
            q = query[span.start : end].transpose(0, 1)
            if span.mask is None:
                k, v = key[span.start : end], value[span.start : end]
            else:
                k, v = k_cache[span.context_slots], v_cache[span.context_slots]
            o = F.scaled_dot_product_attention(
                q,
                k.transpose(0, 1),
                v.transpose(0, 1),
                attn_mask=span.mask,
                is_causal=span.mask is None,
                enable_gqa=True,
            )
            out[span.start : end] = o.transpose(0, 1)
        return out


def _decode_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One query token per sequence: query [B, H, D], keys/values [B, L, KVH, D]."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[2]
    # NOTE: group the query heads that share a KV head, so GQA needs no repeated K/V.
    q = query.view(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.matmul(q, keys.permute(0, 2, 3, 1)) * head_dim**-0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(dim=-1, dtype=torch.float32).to(values.dtype)
    return torch.matmul(probs, values.transpose(1, 2)).reshape(num_seqs, num_heads, head_dim)
