"""Attention by torch ops, where zeroserve's C++ kernel does not run (another dtype or device, no AVX2):
masks for causal and windowed keys, SDPA, and the same math written out for attention sinks (SDPA has none)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# NOTE: measured on 2 Zen 4 cores: the fused kernel is ~4x faster for one sequence, on par at
# 16, and a third slower than two batched matmuls at 64 sequences (3 query heads per KV head).
_SDPA_MAX_DECODES = 16


def seen_keys(positions: torch.Tensor, num_keys: int, window: int | None) -> torch.Tensor:
    """[..., num_keys] booleans: the keys a query at each of `positions` [...] sees (those at or before it and,
    with a `window`, less than `window` positions before it)."""
    distance = positions.unsqueeze(-1) - torch.arange(num_keys, device=positions.device)
    is_seen = distance >= 0
    return is_seen if window is None else is_seen & (distance < window)


def additive_mask(is_seen: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where `is_seen`, -inf elsewhere."""
    return torch.zeros(is_seen.shape, dtype=dtype, device=is_seen.device).masked_fill_(~is_seen, float("-inf"))


def mask_per_row(mask: torch.Tensor, group: int) -> torch.Tensor:
    """[B, 1, Q, L] per query token → [B, 1, group * Q, L] per (query head of a KV head, token) row."""
    num_seqs, _, max_query_len, length = mask.shape
    return mask.unsqueeze(2).expand(num_seqs, 1, group, max_query_len, length).reshape(
        num_seqs, 1, group * max_query_len, length
    )


def math_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """q [B, X, R, D] over k, v [B, KVH, L, D] (query head x reads KV head x // (X / KVH)), as two matmuls and a
    float32 softmax; mask additive or boolean, broadcast to [B, X, R, L]. With `sinks` (logits broadcast to
    [B, X, R, 1]) each row's sink joins its softmax as one more column, then is dropped: it weighs no value
    (transformers' GptOss eager attention)."""
    if q.shape[1] != k.shape[1]:
        k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for x in (k, v))
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if sinks is not None:
        scores = torch.cat((scores, sinks.to(scores.dtype).expand(*scores.shape[:-1], 1)), dim=-1)
    probs = scores.softmax(dim=-1, dtype=torch.float32)
    if sinks is not None:
        probs = probs[..., :-1]
    return torch.matmul(probs.to(v.dtype), v)


def decode_attention(
    rows: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor | None,
    is_one_token: bool,
) -> torch.Tensor:
    """The decodes' rows [B, KVH, R, D] (a KV head's query heads times its sequence's tokens, see
    attention._query_rows) over their keys/values [B, KVH, L, D]; mask [B, 1, R or 1, L] additive, sinks [1, KVH, R, 1]."""
    # NOTE: the query heads that share a KV head become that head's "query positions", so GQA
    # needs no repeated K/V and every one of them sees the sequence's whole (masked) context.
    if sinks is not None or (is_one_token and rows.shape[0] > _SDPA_MAX_DECODES):
        return math_attention(rows, keys, values, mask, sinks)
    return F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask)


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, sinks: torch.Tensor | None
) -> torch.Tensor:
    """One prompt span's queries q [1, H, n, D] over its context's k, v [1, KVH, L, D]; mask [n, L] boolean, None
    where the context is the span itself (causal); sinks [H]."""
    if sinks is None:
        # NOTE: with a batch dimension SDPA takes its fused CPU kernel; 3-D inputs fall back
        # to the unfused math (230 tokens: 0.7 vs 2.8 ms a layer, 512: 1.6 vs 17.9).
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
    if mask is None:
        mask = seen_keys(torch.arange(q.shape[2], device=q.device), k.shape[2], None)
    return math_attention(q, k, v, mask, sinks.view(1, -1, 1, 1))
