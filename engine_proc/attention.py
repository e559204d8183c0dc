"""Paged attention on a flat batch: K/V written through a slot mapping, read through block tables."""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from engine_proc.cpu_kernels import load_cpu_kernels

# NOTE: measured on 2 Zen 4 cores: the fused kernel is ~4x faster for one sequence, on par at
# 16, and a third slower than two batched matmuls at 64 sequences (3 query heads per KV head).
_SDPA_MAX_DECODES = 16
# NOTE: where the C++ kernel runs, prompts are attended in chunks of this many tokens, each chunk
# one of the kernel's "sequences" reading the keys up to its last token: work for every core, and
# causal at chunk granularity. 230-token prompts of the default model: 1.24 ms a layer by SDPA
# against ~0.3 by the kernel (2 Zen 4 cores).
PREFILL_CHUNK_TOKENS = 16


@dataclass
class PrefillSpan:
    """Query tokens `[start, start + num_tokens)` of one sequence with more than one new token."""

    start: int
    num_tokens: int
    context_len: int  # its tokens so far, these included
    block_ids: torch.Tensor  # [ceil(context_len / block_size)] the cache blocks holding them
    mask: torch.Tensor | None  # [num_tokens, context_len]; None when the span is the whole context


@dataclass
class AttentionMetadata:
    """Where this step's tokens go in the cache and what each one attends to.

    The flat batch puts the decodes first (sequences at their last token, with any draft
    tokens after it), then the prefill spans.
    """

    slot_mapping: torch.Tensor  # [num_tokens]
    num_decodes: int
    decode_block_table: torch.Tensor | None  # [num_decodes, max_blocks] block ids, padded with block 0
    decode_lens: torch.Tensor | None  # [num_decodes] context length of each decode, its new tokens included
    prefills: list[PrefillSpan]
    num_decode_tokens: int = -1  # the decodes' tokens in the flat batch; -1: one each
    # With drafts (more than one query token in some decode), the decodes as a padded
    # [num_decodes, max_query_len] grid: each query's position, the flat token each grid cell
    # reads (short rows repeat their last token) and the cell each flat token comes from.
    decode_query_positions: torch.Tensor | None = None
    decode_pad_index: torch.Tensor | None = None  # [num_decodes * max_query_len]; None when no row is short
    decode_unpad_index: torch.Tensor | None = None  # [num_decode_tokens]

    def __post_init__(self) -> None:
        if self.num_decode_tokens < 0:
            self.num_decode_tokens = self.num_decodes


@dataclass
class PrefillChunks:
    """A step's prefill spans cut into chunks of `PREFILL_CHUNK_TOKENS` query tokens, for the kernel."""

    cells: torch.Tensor  # [num_chunks * chunk] the flat token each cell reads (a short last chunk repeats its last)
    block_table: torch.Tensor  # [num_chunks, max_blocks] each chunk's sequence's blocks, padded with block 0
    token_limits: torch.Tensor  # [num_chunks, chunk] how many keys each cell's token sees (its position + 1)
    tokens: torch.Tensor  # [num_prefill_tokens] the spans' flat tokens, in order
    token_cells: torch.Tensor  # [num_prefill_tokens] the cell each of them comes from

    @staticmethod
    def build(spans: list[PrefillSpan], chunk: int, device: torch.device) -> PrefillChunks:
        cells, limits, tables, tokens, token_cells = [], [], [], [], []
        max_blocks = max(int(span.block_ids.shape[0]) for span in spans)
        num_cells = 0
        for span in spans:
            num_chunks = -(-span.num_tokens // chunk)
            offsets = np.minimum(np.arange(num_chunks * chunk), span.num_tokens - 1)
            cells.append(span.start + offsets)
            limits.append(span.context_len - span.num_tokens + offsets + 1)
            block_ids = span.block_ids.to("cpu", torch.int64)
            padded = torch.zeros(max_blocks, dtype=torch.int64)
            padded[: block_ids.shape[0]] = block_ids
            tables.append(padded.expand(num_chunks, max_blocks))
            tokens.append(np.arange(span.start, span.start + span.num_tokens))
            token_cells.append(num_cells + np.arange(span.num_tokens))
            num_cells += num_chunks * chunk

        def joined(parts: list[np.ndarray]) -> torch.Tensor:
            return torch.from_numpy(np.concatenate(parts).astype(np.int64)).to(device)

        return PrefillChunks(
            cells=joined(cells), block_table=torch.cat(tables).contiguous().to(device),
            token_limits=joined(limits).view(-1, chunk), tokens=joined(tokens), token_cells=joined(token_cells),
        )


def decode_query_grid(
    positions: np.ndarray, query_lens: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The decodes' flat tokens (`positions`, `query_lens` per decode) as a [num_decodes, max_query_len] grid.

    Returns each cell's position, the flat token each cell reads (short rows repeat their
    last token) and the cell of each flat token; the two indexes are None when no row is short.
    """
    max_query_len = int(query_lens.max())
    starts = np.cumsum(query_lens) - query_lens
    cells = starts[:, None] + np.minimum(np.arange(max_query_len)[None, :], query_lens[:, None] - 1)
    if not bool((query_lens < max_query_len).any()):
        return positions[cells], None, None
    rows = np.repeat(np.arange(len(query_lens)), query_lens)
    return positions[cells], cells.reshape(-1), rows * max_query_len + np.arange(len(rows)) - starts[rows]


class PagedAttention:
    """The model's attention backend: one K/V cache tensor per layer, shared by all requests.

    A layer's cache is [2, kv_heads, num_slots, head_dim], slot = block_id * block_size +
    offset. Reads gather whole blocks (block_size × head_dim, contiguous) per (sequence,
    kv head) from the [kv_heads * num_blocks, block_size * head_dim] view, so a batch's
    keys come out as [seqs, kv_heads, blocks × block_size, head_dim], ready for matmuls.
    """

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        has_window: bool = False,
    ) -> None:
        self._cache_shape = (num_layers, 2, num_kv_heads, num_slots, head_dim)
        self.has_window = has_window
        self._dtype, self._device = dtype, device
        self.kv_caches: list[torch.Tensor] = []
        self.allocate_cache()
        self.num_kv_heads = num_kv_heads
        self.num_blocks = num_slots // block_size
        self.block_size = block_size
        self.head_dim = head_dim
        self._metadata: AttentionMetadata | None = None
        self._decode_rows: torch.Tensor | None = None
        self._decode_mask: torch.Tensor | None = None
        self._decode_row_mask: torch.Tensor | None = None  # the draft mask per (query head, token) row
        self._prefill_rows: list[torch.Tensor] = []
        # NOTE: the C++ kernel reads blocks in place: bfloat16 on x86 with AVX-512 BF16.
        kernels = load_cpu_kernels() if dtype == torch.bfloat16 and device.type == "cpu" else None
        self._decode_kernel = (
            kernels.paged_decode_attention if kernels is not None and head_dim % 16 == 0 and block_size == 16 else None
        )
        self.choice = (
            f"zeroserve C++ paged kernel (decodes, and prompts in chunks of {PREFILL_CHUNK_TOKENS} tokens)"
            if self._decode_kernel else "torch SDPA"
        )
        # NOTE: rotary and the cache write in one pass, for bfloat16 (head_dim a multiple of 32).
        self._rotary_kernel = kernels.rotary_store_kv if kernels is not None and head_dim % 32 == 0 else None
        self._decode_token_limits: torch.Tensor | None = None  # [num_decodes, max_query_len] keys each token sees
        self._decode_row_limits: torch.Tensor | None = None  # the same per (query head, token) row
        self._prefill_chunks: PrefillChunks | None = None  # the prefill spans for the kernel, where it runs
        self._prefill_row_limits: torch.Tensor | None = None
        self._windowed: dict[int, list[WindowedSequence]] = {}  # this step's sequences past each window

    @property
    def is_row_invariant(self) -> bool:
        """Whether each query row's result is the same bits whatever shares its step: the C++ kernel
        reads a row's keys block by block, in order, as a decode, a prompt chunk or a cached prefix
        alike (torch's SDPA picks its split by the shapes). Not with a sliding window (`has_window`): a
        sequence past it is attended again by torch's SDPA, its shapes set by how its prompt was chunked."""
        return self._decode_kernel is not None and not self.has_window

    def allocate_cache(self) -> None:
        num_layers, *shape = self._cache_shape
        # NOTE: zeros, not empty: padded decode slots are read (then masked), and garbage
        # NaNs would leak through the zero attention weights.
        self.kv_caches = [_zeros(shape, self._dtype, self._device) for _ in range(num_layers)]

    def free_cache(self) -> None:
        self.kv_caches = []

    @property
    def metadata(self) -> AttentionMetadata | None:
        return self._metadata

    @metadata.setter
    def metadata(self, metadata: AttentionMetadata | None) -> None:
        """Sets this step's metadata and derives, once for all layers, the blocks to gather."""
        self._metadata = metadata
        self._decode_rows, self._decode_mask, self._prefill_rows = None, None, []
        self._decode_row_mask, self._decode_token_limits, self._decode_row_limits = None, None, None
        self._prefill_chunks, self._prefill_row_limits = None, None
        self._windowed = {}
        if metadata is None:
            return
        if self._decode_kernel is not None and metadata.prefills:
            self._prefill_chunks = PrefillChunks.build(metadata.prefills, PREFILL_CHUNK_TOKENS, self._device)
        if self._decode_kernel is not None and metadata.decode_lens is not None:
            positions = metadata.decode_query_positions
            self._decode_token_limits = metadata.decode_lens.unsqueeze(1) if positions is None else positions + 1
        elif metadata.decode_block_table is not None and metadata.decode_lens is not None:
            self._decode_rows = self._block_rows(metadata.decode_block_table)
            num_blocks = metadata.decode_block_table.shape[1]
            if metadata.decode_query_positions is None:
                self._decode_mask = self._additive_mask(metadata.decode_lens, num_blocks)
            else:
                self._decode_mask = self._causal_mask(metadata.decode_query_positions, num_blocks)
        if self._prefill_chunks is None:
            self._prefill_rows = [self._block_rows(span.block_ids) for span in metadata.prefills]

    def _block_rows(self, block_ids: torch.Tensor) -> torch.Tensor:
        """Rows [2, ..., kv_heads, num_blocks_used] of the block view for the K and V of `block_ids` [..., num_blocks_used]."""
        heads = torch.arange(2 * self.num_kv_heads, device=block_ids.device).view(2, *[1] * (block_ids.dim() - 1), -1, 1)
        return heads * self.num_blocks + block_ids.unsqueeze(-2)

    def _additive_mask(self, lens: torch.Tensor, num_blocks: int) -> torch.Tensor | None:
        """[num_decodes, 1, 1, num_blocks * block_size]: 0 where a decode attends, -inf past its context."""
        padded_len = num_blocks * self.block_size
        is_valid = torch.arange(padded_len, device=lens.device) < lens.unsqueeze(1)
        if bool(is_valid.all()):
            return None
        mask = torch.zeros(is_valid.shape, dtype=self._dtype, device=lens.device)
        return mask.masked_fill_(~is_valid, float("-inf")).view(lens.shape[0], 1, 1, padded_len)

    def _causal_mask(self, query_positions: torch.Tensor, num_blocks: int) -> torch.Tensor:
        """[num_decodes, 1, max_query_len, num_blocks * block_size]: 0 up to each query's own position, -inf after."""
        is_valid = torch.arange(num_blocks * self.block_size, device=query_positions.device) <= query_positions.unsqueeze(-1)
        mask = torch.zeros(is_valid.shape, dtype=self._dtype, device=query_positions.device)
        return mask.masked_fill_(~is_valid, float("-inf")).unsqueeze(1)

    def _gather(self, cache: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [..., kv_heads, blocks * block_size, head_dim] for rows [2, ..., kv_heads, blocks]."""
        blocks = cache.view(2 * self.num_kv_heads * self.num_blocks, self.block_size * self.head_dim)
        gathered = blocks.index_select(0, rows.reshape(-1))
        keys, values = gathered.view(*rows.shape[:-1], rows.shape[-1] * self.block_size, self.head_dim)
        return keys, values

    def rotate_and_store(
        self, layer_idx: int, qkv: torch.Tensor, rotary_table: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Rotated queries and keys, K/V stored, by the C++ kernel where it runs (bfloat16 on x86)."""
        meta = self._metadata
        assert meta is not None, "attention metadata must be set before the forward"
        if self._rotary_kernel is None or rotary_table.dtype != self._dtype or not qkv.is_contiguous():
            return None
        num_heads = qkv.shape[1] // self.head_dim - 2 * self.num_kv_heads
        query, key = self._rotary_kernel(qkv, rotary_table, meta.slot_mapping, self.kv_caches[layer_idx], num_heads)
        return query, key

    def forward(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_stored: bool = False,
        window: int | None = None,
    ) -> torch.Tensor:
        meta = self._metadata
        assert meta is not None, "attention metadata must be set before the forward"
        cache = self.kv_caches[layer_idx]
        if not is_stored:
            # NOTE: one copy for K and V: [num_tokens, 2, kv_heads, head_dim] -> [2, kv_heads, num_tokens, head_dim].
            cache.index_copy_(2, meta.slot_mapping, torch.stack((key, value), dim=1).permute(1, 2, 0, 3))
        out = self._attend(cache, query, key, value, meta)
        if window is not None:
            # NOTE: sequences whose context reaches past the window are attended again over their window
            # alone, each on its own (so a row's result depends on its own sequence only, as without one).
            for sequence in self._sequences_past(window, meta):
                out.index_copy_(0, sequence.tokens, self._windowed_attention(cache, query, sequence, window))
        return out

    def _attend(
        self, cache: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """Causal attention over each sequence's whole context."""
        num_decode_tokens = meta.num_decode_tokens
        if meta.num_decodes:
            decoded = self._decode(cache, query[:num_decode_tokens] if meta.prefills else query, meta)
            if not meta.prefills:
                return decoded
        out = torch.empty_like(query)
        if meta.num_decodes:
            out[:num_decode_tokens] = decoded
        if self._prefill_chunks is not None:
            return out.index_copy_(0, self._prefill_chunks.tokens, self._kernel_prefill_attention(cache, query))
        for span, rows in zip(meta.prefills, self._prefill_rows, strict=True):
            end = span.start + span.num_tokens
            q = query[span.start : end].transpose(0, 1)
            if span.mask is None:
                k, v = key[span.start : end].transpose(0, 1), value[span.start : end].transpose(0, 1)
            else:
                k, v = (kv[:, : span.context_len] for kv in self._gather(cache, rows))
            # NOTE: with a batch dimension SDPA takes its fused CPU kernel; 3-D inputs fall back
            # to the unfused math (230 tokens: 0.7 vs 2.8 ms a layer, 512: 1.6 vs 17.9).
            o = F.scaled_dot_product_attention(
                q[None], k[None], v[None], attn_mask=span.mask, is_causal=span.mask is None, enable_gqa=True
            )
            out[span.start : end] = o[0].transpose(0, 1)
        return out

    def _sequences_past(self, window: int, meta: AttentionMetadata) -> list[WindowedSequence]:
        """This step's sequences with a query token more than `window` positions past a key it would see."""
        if window not in self._windowed:
            sequences = [s for s in _step_sequences(meta) if int(s.positions.max()) >= window]
            self._windowed[window] = sequences
        return self._windowed[window]

    def _windowed_attention(
        self, cache: torch.Tensor, query: torch.Tensor, sequence: WindowedSequence, window: int
    ) -> torch.Tensor:
        """One sequence's tokens [n, H, D], each attending to the keys of its last `window` positions (only
        the blocks holding those are read)."""
        context_len = int(sequence.positions.max()) + 1
        first_block = max(0, int(sequence.positions.min()) - window + 1) // self.block_size
        first_key = first_block * self.block_size
        rows = self._block_rows(sequence.block_ids[first_block : -(-context_len // self.block_size)])
        keys, values = (kv[:, : context_len - first_key] for kv in self._gather(cache, rows))
        key_positions = torch.arange(first_key, context_len, device=query.device)
        distance = sequence.positions.unsqueeze(1) - key_positions
        is_seen = (distance >= 0) & (distance < window)
        mask = torch.zeros(is_seen.shape, dtype=query.dtype, device=query.device).masked_fill_(~is_seen, float("-inf"))
        q = query.index_select(0, sequence.tokens).transpose(0, 1)
        out = F.scaled_dot_product_attention(q[None], keys[None], values[None], attn_mask=mask, enable_gqa=True)
        return out[0].transpose(0, 1)

    def _decode(self, cache: torch.Tensor, query: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The decodes' attention: by the C++ kernel where it runs, else over gathered blocks."""
        if self._decode_token_limits is not None:
            return self._kernel_decode_attention(cache, query, meta)
        assert self._decode_rows is not None
        keys, values = self._gather(cache, self._decode_rows)
        if meta.decode_query_positions is None:
            return _decode_attention(query, keys, values, self._decode_mask)
        if self._decode_row_mask is None:
            assert self._decode_mask is not None
            self._decode_row_mask = _mask_per_row(self._decode_mask, query.shape[1] // self.num_kv_heads)
        return _multi_query_decode_attention(query, keys, values, self._decode_row_mask, meta)

    def _kernel_decode_attention(self, cache: torch.Tensor, query: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """The decodes' attention by the C++ kernel, straight from the cache blocks."""
        assert self._decode_kernel is not None and self._decode_token_limits is not None
        assert meta.decode_block_table is not None
        if self._decode_row_limits is None:
            group = query.shape[1] // self.num_kv_heads
            self._decode_row_limits = self._decode_token_limits.repeat(1, group)
        rows = _query_rows(query, meta, self.num_kv_heads).contiguous()
        out = self._decode_kernel(rows, cache, meta.decode_block_table, self._decode_row_limits, self.head_dim**-0.5)
        return _from_query_rows(out, meta, query.shape[1])

    def _kernel_prefill_attention(self, cache: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The prefill spans' attention [num_prefill_tokens, H, D] by the C++ kernel, chunk by chunk
        (each chunk's rows laid out as a decode's with drafts, see `_query_rows`)."""
        chunks = self._prefill_chunks
        assert self._decode_kernel is not None and chunks is not None
        num_chunks, chunk = chunks.token_limits.shape
        num_heads, head_dim = query.shape[1:]
        group = num_heads // self.num_kv_heads
        if self._prefill_row_limits is None:
            self._prefill_row_limits = chunks.token_limits.repeat(1, group)
        rows = query.index_select(0, chunks.cells).view(num_chunks, chunk, self.num_kv_heads, group, head_dim)
        rows = rows.permute(0, 2, 3, 1, 4).reshape(num_chunks, self.num_kv_heads, group * chunk, head_dim).contiguous()
        out = self._decode_kernel(rows, cache, chunks.block_table, self._prefill_row_limits, head_dim**-0.5)
        out = out.view(num_chunks, self.num_kv_heads, group, chunk, head_dim).permute(0, 3, 1, 2, 4)
        return out.reshape(num_chunks * chunk, num_heads, head_dim).index_select(0, chunks.token_cells)


@dataclass
class WindowedSequence:
    """One sequence of a step, for attention over a window: its flat tokens, their positions, its blocks."""

    tokens: torch.Tensor  # [n] indexes into the flat batch
    positions: torch.Tensor  # [n]
    block_ids: torch.Tensor  # [num_blocks] the cache blocks holding its context


def _step_sequences(meta: AttentionMetadata) -> list[WindowedSequence]:
    """Every sequence of the step: the decodes (drafts included), then the prefill spans."""
    sequences = []
    if meta.num_decodes and meta.decode_block_table is not None and meta.decode_lens is not None:
        device = meta.decode_lens.device
        if meta.decode_query_positions is None:
            cells = torch.arange(meta.num_decodes, device=device)
            positions = meta.decode_lens - 1
            max_query_len = 1
        else:
            max_query_len = meta.decode_query_positions.shape[1]
            cells = meta.decode_unpad_index
            if cells is None:
                cells = torch.arange(meta.decode_query_positions.numel(), device=device)
            positions = meta.decode_query_positions.reshape(-1).index_select(0, cells)
        rows = cells // max_query_len
        for row in range(meta.num_decodes):
            tokens = torch.nonzero(rows == row).flatten()
            sequences.append(WindowedSequence(tokens, positions.index_select(0, tokens), meta.decode_block_table[row]))
    for span in meta.prefills:
        tokens = torch.arange(span.start, span.start + span.num_tokens, device=meta.slot_mapping.device)
        positions = tokens - span.start + (span.context_len - span.num_tokens)
        sequences.append(WindowedSequence(tokens, positions, span.block_ids))
    return sequences


def _decode_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """One query token per sequence: query [B, H, D], keys/values [B, KVH, L, D], mask [B, 1, 1, L] additive."""
    num_seqs, num_heads, head_dim = query.shape
    num_kv_heads = keys.shape[1]
    # NOTE: the query heads that share a KV head become that head's "query positions", so GQA
    # needs no repeated K/V and every one of them sees the sequence's whole (masked) context.
    q = query.reshape(num_seqs, num_kv_heads, num_heads // num_kv_heads, head_dim)
    if num_seqs <= _SDPA_MAX_DECODES:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    else:
        scores = torch.matmul(q, keys.transpose(2, 3)) * head_dim**-0.5
        if mask is not None:
            scores = scores + mask
        probs = scores.softmax(dim=-1, dtype=torch.float32).to(values.dtype)
        out = torch.matmul(probs, values)
    return out.view(num_seqs, num_heads, head_dim)


def _mask_per_row(mask: torch.Tensor, group: int) -> torch.Tensor:
    """[B, 1, Q, L] per query token → [B, 1, group * Q, L] per (query head of a KV head, token) row."""
    num_seqs, _, max_query_len, length = mask.shape
    return mask.unsqueeze(2).expand(num_seqs, 1, group, max_query_len, length).reshape(
        num_seqs, 1, group * max_query_len, length
    )


def _multi_query_decode_attention(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, row_mask: torch.Tensor, meta: AttentionMetadata
) -> torch.Tensor:
    """Decodes with draft tokens: query [T, H, D] flat, laid out as a [B, Q] grid; row_mask from `_mask_per_row`."""
    out = F.scaled_dot_product_attention(_query_rows(query, meta, keys.shape[1]), keys, values, attn_mask=row_mask)
    return _from_query_rows(out, meta, query.shape[1])


def _query_rows(query: torch.Tensor, meta: AttentionMetadata, num_kv_heads: int) -> torch.Tensor:
    """The decodes' queries [T, H, D] as [B, KVH, group × Q, D]: each KV head's query heads times its sequence's tokens.

    As for one token, where a KV head's query heads become its "query positions", with drafts
    the [B, Q] grid's tokens multiply them: (group × Q) rows per KV head, a row sees what its token sees.
    """
    num_heads, head_dim = query.shape[1:]
    group = num_heads // num_kv_heads
    if meta.decode_query_positions is None:
        return query.reshape(meta.num_decodes, num_kv_heads, group, head_dim)
    num_seqs, max_query_len = meta.decode_query_positions.shape
    if meta.decode_pad_index is not None:
        query = query.index_select(0, meta.decode_pad_index)
    q = query.view(num_seqs, max_query_len, num_kv_heads, group, head_dim).permute(0, 2, 3, 1, 4)
    return q.reshape(num_seqs, num_kv_heads, group * max_query_len, head_dim)


def _from_query_rows(out: torch.Tensor, meta: AttentionMetadata, num_heads: int) -> torch.Tensor:
    """The inverse of `_query_rows`: [B, KVH, group × Q, D] back to the flat [T, H, D]."""
    num_seqs, num_kv_heads, num_rows, head_dim = out.shape
    if meta.decode_query_positions is None:
        return out.reshape(num_seqs, num_heads, head_dim)
    max_query_len = meta.decode_query_positions.shape[1]
    out = out.view(num_seqs, num_kv_heads, num_rows // max_query_len, max_query_len, head_dim).permute(0, 3, 1, 2, 4)
    out = out.reshape(num_seqs * max_query_len, num_heads, head_dim).contiguous()
    if meta.decode_unpad_index is not None:
        out = out.index_select(0, meta.decode_unpad_index)
    return out


def _zeros(shape: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor; on the CPU from memory the OS hands out zeroed as it is first written
    (a private anonymous mapping), so a cache's pages are taken as its blocks fill, not all at
    start: the default 4 GiB cache made every start 1.9 s longer (2.3 s of CPU, mostly page
    faults) writing zeros."""
    if device.type != "cpu":
        return torch.zeros(*shape, dtype=dtype, device=device)
    # NOTE: numpy has no bfloat16: 16-bit integers of the same size, viewed as it.
    int_dtype = np.dtype(f"int{dtype.itemsize * 8}")
    num_bytes = math.prod(shape) * dtype.itemsize
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    if num_bytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.from_numpy(np.zeros(shape, dtype=int_dtype)).view(dtype)
    # NOTE: a mapping of its own, not numpy's calloc: that can hand back memory the process used
    # before, which it must zero by writing (in a long test process the whole cache once became
    # resident as it was first read); and numpy asks for transparent huge pages, which Linux's
    # khugepaged may fill as whole 2 MB pages around each block touched.
    region = mmap.mmap(-1, num_bytes, flags=flags)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)
    return torch.from_numpy(np.frombuffer(region, dtype=int_dtype).reshape(shape)).view(dtype)
