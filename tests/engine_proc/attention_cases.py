"""One batched decode step over random paged contexts, with dense causal attention's answer for it (with a
sliding window and attention sinks where asked)."""

from __future__ import annotations

import numpy as np
import torch

from engine_proc.attention import AttentionMetadata, PagedAttention, PrefillSpan, decode_query_grid
from tests.engine_proc.models.dense_attention import dense_attention

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 6, 2, 8, 4


def decode_step(
    query_lens: list[int],
    *,
    dtype: torch.dtype = torch.float32,
    num_heads: int = NUM_HEADS,
    num_kv_heads: int = NUM_KV_HEADS,
    head_dim: int = HEAD_DIM,
    block_size: int = BLOCK_SIZE,
    max_context_len: int = 13,
    is_kernel_allowed: bool = True,
    window: int | None = None,
    has_sinks: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefills a random context per sequence, then decodes `query_lens` tokens of each in one batched step.

    Returns the step's attention output and dense causal attention's (float32) for the same tokens.
    """
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    num_seqs = len(query_lens)
    context_lens = [int(n) for n in rng.integers(1, max_context_len + 1, num_seqs)]
    num_blocks = max(64, sum(-(-(c + n) // block_size) for c, n in zip(context_lens, query_lens, strict=True)) + 8)
    attention = PagedAttention(1, num_blocks * block_size, num_kv_heads, head_dim, block_size, dtype, torch.device("cpu"))
    if not is_kernel_allowed:
        attention._decode_kernel = None
    # Each sequence gets scattered blocks, enough for its context and its new tokens.
    free_blocks = list(rng.permutation(num_blocks))
    block_ids = [[int(free_blocks.pop()) for _ in range(-(-(c + n) // block_size))] for c, n in zip(context_lens, query_lens, strict=True)]
    totals = [c + n for c, n in zip(context_lens, query_lens, strict=True)]
    keys = [torch.randn(t, num_kv_heads, head_dim).to(dtype) for t in totals]
    values = [torch.randn(t, num_kv_heads, head_dim).to(dtype) for t in totals]
    queries = [torch.randn(n, num_heads, head_dim).to(dtype) for n in query_lens]

    def slots(seq: int, positions: range) -> list[int]:
        return [block_ids[seq][p // block_size] * block_size + p % block_size for p in positions]

    # Step 1: each context as a whole prefill span.
    spans, start = [], 0
    for seq, c in enumerate(context_lens):
        spans.append(PrefillSpan(start, c, c, torch.tensor(block_ids[seq][: -(-c // block_size)]), None))
        start += c
    attention.metadata = AttentionMetadata(
        torch.tensor([s for seq, c in enumerate(context_lens) for s in slots(seq, range(c))]), 0, None, None, spans,
    )
    attention.forward(
        0, torch.randn(sum(context_lens), num_heads, head_dim).to(dtype),
        torch.cat([k[:c] for k, c in zip(keys, context_lens, strict=True)]), torch.cat([v[:c] for v, c in zip(values, context_lens, strict=True)]),
    )
    # Step 2: every sequence's last token plus drafts, as one batched decode.
    positions = np.concatenate([np.arange(c, c + n) for c, n in zip(context_lens, query_lens, strict=True)])
    table = torch.zeros(num_seqs, max(len(b) for b in block_ids), dtype=torch.long)
    for seq, blocks in enumerate(block_ids):
        table[seq, : len(blocks)] = torch.tensor(blocks)
    metadata = AttentionMetadata(
        torch.tensor([s for seq, (c, n) in enumerate(zip(context_lens, query_lens, strict=True)) for s in slots(seq, range(c, c + n))]),
        num_seqs, table, torch.tensor(totals), [], num_decode_tokens=len(positions),
    )
    if max(query_lens) > 1:
        grid_positions, pad_index, unpad_index = decode_query_grid(positions, np.array(query_lens))
        metadata.decode_query_positions = torch.from_numpy(grid_positions)
        if pad_index is not None and unpad_index is not None:
            metadata.decode_pad_index, metadata.decode_unpad_index = torch.from_numpy(pad_index), torch.from_numpy(unpad_index)
    attention.metadata = metadata
    return forward_and_reference(attention, queries, keys, values, context_lens, window, sinks(num_heads, dtype, has_sinks))


def sinks(num_heads: int, dtype: torch.dtype, has_sinks: bool) -> torch.Tensor | None:
    """Sink logits [num_heads] from well below to well above the scores' range (some heads mostly sink), or None."""
    return torch.linspace(-3.0, 4.0, num_heads).to(dtype) if has_sinks else None


def forward_and_reference(
    attention: PagedAttention, queries: list[torch.Tensor], keys: list[torch.Tensor], values: list[torch.Tensor],
    starts: list[int], window: int | None = None, sinks: torch.Tensor | None = None,
    earlier_windows: tuple[int | None, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's attention output for each sequence's queries (its keys and values from `starts` on
    are the step's new ones), after layers of `earlier_windows` in the same step, and dense causal
    attention's (float32) for the same tokens."""
    new_keys = torch.cat([k[s:] for k, s in zip(keys, starts, strict=True)])
    new_values = torch.cat([v[s:] for v, s in zip(values, starts, strict=True)])
    for earlier in earlier_windows:
        attention.forward(0, torch.cat(queries), new_keys, new_values, window=earlier, sinks=sinks)
    out = attention.forward(0, torch.cat(queries), new_keys, new_values, window=window, sinks=sinks)
    expected = torch.cat([
        dense_attention(q.float(), k.float(), v.float(), s, window, None if sinks is None else sinks.float())
        for q, k, v, s in zip(queries, keys, values, starts, strict=True)
    ])
    return out, expected


def mixed_step(
    decode_contexts: list[int], spans: list[tuple[int, int]], *, is_kernel_allowed: bool = True,
    num_heads: int = 9, num_kv_heads: int = 3, head_dim: int = 64, block_size: int = 16, window: int | None = None,
    has_sinks: bool = False, earlier_windows: tuple[int | None, ...] = (),
) -> tuple[torch.Tensor, torch.Tensor]:
    """One bfloat16 step of decodes (one token after each of `decode_contexts`) then prefill spans
    ((tokens already cached, new tokens) each), over scattered blocks whose earlier K/V are in the cache.

    Returns the step's attention output and dense causal attention's (float32) for the same tokens.
    """
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    dtype = torch.bfloat16
    totals = [c + 1 for c in decode_contexts] + [cached + new for cached, new in spans]
    starts = list(decode_contexts) + [cached for cached, _ in spans]
    num_blocks = sum(-(-t // block_size) for t in totals) + 8
    attention = PagedAttention(1, num_blocks * block_size, num_kv_heads, head_dim, block_size, dtype, torch.device("cpu"))
    if not is_kernel_allowed:
        attention._decode_kernel = None
    free_blocks = list(rng.permutation(num_blocks))
    block_ids = [[int(free_blocks.pop()) for _ in range(-(-t // block_size))] for t in totals]
    keys = [torch.randn(t, num_kv_heads, head_dim).to(dtype) for t in totals]
    values = [torch.randn(t, num_kv_heads, head_dim).to(dtype) for t in totals]
    queries = [torch.randn(t - s, num_heads, head_dim).to(dtype) for t, s in zip(totals, starts, strict=True)]

    def slots(seq: int, positions: range) -> torch.Tensor:
        return torch.tensor([block_ids[seq][p // block_size] * block_size + p % block_size for p in positions], dtype=torch.long)

    cache = attention.kv_caches[0]
    for seq, start in enumerate(starts):  # what earlier steps stored
        cached = slots(seq, range(start))
        cache[0][:, cached] = keys[seq][:start].transpose(0, 1)
        cache[1][:, cached] = values[seq][:start].transpose(0, 1)
    num_decodes = len(decode_contexts)
    table = torch.zeros(max(num_decodes, 1), max(len(b) for b in block_ids), dtype=torch.long)
    for seq in range(num_decodes):
        table[seq, : len(block_ids[seq])] = torch.tensor(block_ids[seq])
    prefills, flat = [], num_decodes
    for seq, (cached, new) in enumerate(spans, start=num_decodes):
        positions = np.arange(cached, cached + new)
        mask = torch.from_numpy(np.arange(cached + new)[None, :] <= positions[:, None]) if cached else None
        prefills.append(PrefillSpan(flat, new, cached + new, torch.tensor(block_ids[seq]), mask))
        flat += new
    attention.metadata = AttentionMetadata(
        torch.cat([slots(seq, range(start, total)) for seq, (start, total) in enumerate(zip(starts, totals, strict=True))]),
        num_decodes, table if num_decodes else None, torch.tensor(totals[:num_decodes]) if num_decodes else None, prefills,
    )
    return forward_and_reference(
        attention, queries, keys, values, starts, window, sinks(num_heads, dtype, has_sinks), earlier_windows
    )
