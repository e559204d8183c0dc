"""Paged attention on a flat batch: K/V written through a slot mapping, read through block tables."""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import numpy as np
import torch

from engine_proc.cpu.kernels import load_cpu_kernels
from engine_proc.models.attention_api import DecodeStep, HeadNorms
from engine_proc.torch_attention import additive_mask, decode_attention, mask_per_row, prefill_attention, seen_keys

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
    Where the C++ kernel runs it reads the blocks in place instead, each row over its own key
    range (a sliding window's first key to its position), so windowed layers need no other path.
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
    ) -> None:
        self._cache_shape = (num_layers, 2, num_kv_heads, num_slots, head_dim)
        self._dtype, self._device = dtype, device
        self.kv_caches: list[torch.Tensor] = []
        self.allocate_cache()
        self.num_kv_heads = num_kv_heads
        self.num_blocks = num_slots // block_size
        self.block_size = block_size
        self.head_dim = head_dim
        self._metadata: AttentionMetadata | None = None
        self._decode_rows: torch.Tensor | None = None
        self._decode_masks: dict[int | None, torch.Tensor | None] = {}  # the torch path's, per window
        self._prefill_rows: list[torch.Tensor] = []
        # NOTE: the C++ kernel reads blocks in place: bfloat16 on x86 with AVX-512 BF16 or AVX2 (cpu/kernels.py).
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
        self._prefill_chunks: PrefillChunks | None = None  # the prefill spans for the kernel, where it runs
        # the kernel's (row limits, row starts) per (decodes or prefill chunks, window)
        self._row_ranges: dict[tuple[str, int | None], tuple[torch.Tensor, torch.Tensor | None]] = {}

    @property
    def is_row_invariant(self) -> bool:
        """Whether each query row's result is the same bits whatever shares its step: the C++ kernel
        reads a row's keys block by block, in order, as a decode, a prompt chunk or a cached prefix
        alike, with or without a window (torch's SDPA picks its split by the shapes)."""
        return self._decode_kernel is not None

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
        self._decode_rows, self._decode_masks, self._prefill_rows = None, {}, []
        self._decode_token_limits, self._prefill_chunks, self._row_ranges = None, None, {}
        if metadata is None:
            return
        if self._decode_kernel is not None and metadata.prefills:
            self._prefill_chunks = PrefillChunks.build(metadata.prefills, PREFILL_CHUNK_TOKENS, self._device)
        if self._decode_kernel is not None and metadata.decode_lens is not None:
            positions = metadata.decode_query_positions
            self._decode_token_limits = metadata.decode_lens.unsqueeze(1) if positions is None else positions + 1
        elif metadata.decode_block_table is not None and metadata.decode_lens is not None:
            self._decode_rows = self._block_rows(metadata.decode_block_table)
        if self._prefill_chunks is None:
            self._prefill_rows = [self._block_rows(span.block_ids) for span in metadata.prefills]

    def _block_rows(self, block_ids: torch.Tensor) -> torch.Tensor:
        """Rows [2, ..., kv_heads, num_blocks_used] of the block view for the K and V of `block_ids` [..., num_blocks_used]."""
        heads = torch.arange(2 * self.num_kv_heads, device=block_ids.device).view(2, *[1] * (block_ids.dim() - 1), -1, 1)
        return heads * self.num_blocks + block_ids.unsqueeze(-2)

    def _gather(self, cache: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values [..., kv_heads, blocks * block_size, head_dim] for rows [2, ..., kv_heads, blocks]."""
        blocks = cache.view(2 * self.num_kv_heads * self.num_blocks, self.block_size * self.head_dim)
        gathered = blocks.index_select(0, rows.reshape(-1))
        keys, values = gathered.view(*rows.shape[:-1], rows.shape[-1] * self.block_size, self.head_dim)
        return keys, values

    def rotate_and_store(
        self, layer_idx: int, qkv: torch.Tensor, rotary_table: torch.Tensor, head_norms: HeadNorms | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Rotated queries and keys (each head normed first, with head_norms), K/V stored, by the C++ kernel
        where it runs (bfloat16 on x86)."""
        meta = self._metadata
        assert meta is not None, "attention metadata must be set before the forward"
        norm_dtypes = {self._dtype} if head_norms is None else {head_norms.query_weight.dtype}
        if self._rotary_kernel is None or {rotary_table.dtype, *norm_dtypes} != {self._dtype} or not qkv.is_contiguous():
            return None
        num_heads = qkv.shape[1] // self.head_dim - 2 * self.num_kv_heads
        norms = head_norms or (None, None, 0.0)
        query, key = self._rotary_kernel(qkv, rotary_table, meta.slot_mapping, self.kv_caches[layer_idx], num_heads, *norms)
        return query, key

    def decode_step(self, group: int) -> DecodeStep | None:
        """The paged kernels' arguments for a step of one-token decodes alone, where both kernels run (see
        AttentionBackend.decode_step)."""
        meta = self._metadata
        if meta is None or meta.prefills or meta.decode_query_positions is not None or self._rotary_kernel is None:
            return None
        if self._decode_token_limits is None or meta.decode_block_table is None:
            return None
        limits, _ = self._kernel_rows("decode", self._decode_token_limits, group, None)
        return DecodeStep(meta.slot_mapping, self.kv_caches, meta.decode_block_table, limits, self.head_dim**-0.5)

    def forward(
        self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_stored: bool = False,
        window: int | None = None, sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        meta = self._metadata
        assert meta is not None, "attention metadata must be set before the forward"
        cache = self.kv_caches[layer_idx]
        if not is_stored:
            # NOTE: one copy for K and V: [num_tokens, 2, kv_heads, head_dim] -> [2, kv_heads, num_tokens, head_dim].
            cache.index_copy_(2, meta.slot_mapping, torch.stack((key, value), dim=1).permute(1, 2, 0, 3))
        num_decode_tokens = meta.num_decode_tokens
        if meta.num_decodes:
            decoded = self._decode(cache, query[:num_decode_tokens] if meta.prefills else query, meta, window, sinks)
            if not meta.prefills:
                return decoded
        out = torch.empty_like(query)
        if meta.num_decodes:
            out[:num_decode_tokens] = decoded
        if self._prefill_chunks is not None:
            prefilled = self._kernel_prefill_attention(cache, query, window, sinks)
            return out.index_copy_(0, self._prefill_chunks.tokens, prefilled)
        for span, rows in zip(meta.prefills, self._prefill_rows, strict=True):
            end = span.start + span.num_tokens
            mask = span.mask
            if window is not None and span.context_len > window:
                positions = torch.arange(span.context_len - span.num_tokens, span.context_len, device=query.device)
                mask = seen_keys(positions, span.context_len, window)
            if span.mask is None:  # the span is the whole context
                k, v = key[span.start : end].transpose(0, 1), value[span.start : end].transpose(0, 1)
            else:
                k, v = (kv[:, : span.context_len] for kv in self._gather(cache, rows))
            o = prefill_attention(query[span.start : end].transpose(0, 1)[None], k[None], v[None], mask, sinks)
            out[span.start : end] = o[0].transpose(0, 1)
        return out

    def _decode(
        self, cache: torch.Tensor, query: torch.Tensor, meta: AttentionMetadata, window: int | None,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """The decodes' attention: by the C++ kernel where it runs, else over gathered blocks."""
        if self._decode_token_limits is not None:
            return self._kernel_decode_attention(cache, query, meta, window, sinks)
        assert self._decode_rows is not None
        keys, values = self._gather(cache, self._decode_rows)
        rows = _query_rows(query, meta, self.num_kv_heads)
        group = query.shape[1] // self.num_kv_heads
        max_query_len = 1 if meta.decode_query_positions is None else meta.decode_query_positions.shape[1]
        row_sinks = _row_sinks(sinks, self.num_kv_heads, max_query_len)
        out = decode_attention(
            rows, keys, values, self._fallback_decode_mask(meta, window, group),
            None if row_sinks is None else row_sinks[None, :, :, None], is_one_token=max_query_len == 1,
        )
        return _from_query_rows(out, meta, query.shape[1])

    def _fallback_decode_mask(self, meta: AttentionMetadata, window: int | None, group: int) -> torch.Tensor | None:
        """The torch path's additive decode mask, made once a step for all layers of a `window`: [B, 1, 1, L]
        for one token each, else [B, 1, group × Q, L] per row; None where every decode sees every key read."""
        if window not in self._decode_masks:
            assert meta.decode_lens is not None and meta.decode_block_table is not None
            positions = meta.decode_query_positions
            if positions is None:
                positions = (meta.decode_lens - 1).unsqueeze(1)
            is_seen = seen_keys(positions, meta.decode_block_table.shape[1] * self.block_size, window)
            mask = None if bool(is_seen.all()) else additive_mask(is_seen, self._dtype).unsqueeze(1)
            if mask is not None and meta.decode_query_positions is not None:
                mask = mask_per_row(mask, group)
            self._decode_masks[window] = mask
        return self._decode_masks[window]

    def _kernel_rows(
        self, name: str, token_limits: torch.Tensor, group: int, window: int | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The kernel's key range of each (query head, token) row, made once a step for all layers of a
        `window`: how many keys it sees ([S, group × Q], from `token_limits` [S, Q]) and, with a window,
        the first of them (its position - window + 1)."""
        if (name, window) not in self._row_ranges:
            limits = token_limits.repeat(1, group)
            starts = None if window is None else (limits - window).clamp_(min=0)
            self._row_ranges[name, window] = (limits, starts)
        return self._row_ranges[name, window]

    def _kernel_decode_attention(
        self, cache: torch.Tensor, query: torch.Tensor, meta: AttentionMetadata, window: int | None,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        """The decodes' attention by the C++ kernel, straight from the cache blocks."""
        assert self._decode_kernel is not None and self._decode_token_limits is not None
        assert meta.decode_block_table is not None
        group = query.shape[1] // self.num_kv_heads
        limits, starts = self._kernel_rows("decode", self._decode_token_limits, group, window)
        row_sinks = _row_sinks(sinks, self.num_kv_heads, self._decode_token_limits.shape[1])
        rows = _query_rows(query, meta, self.num_kv_heads).contiguous()
        out = self._decode_kernel(rows, cache, meta.decode_block_table, limits, self.head_dim**-0.5, starts, row_sinks)
        return _from_query_rows(out, meta, query.shape[1])

    def _kernel_prefill_attention(
        self, cache: torch.Tensor, query: torch.Tensor, window: int | None, sinks: torch.Tensor | None
    ) -> torch.Tensor:
        """The prefill spans' attention [num_prefill_tokens, H, D] by the C++ kernel, chunk by chunk
        (each chunk's rows laid out as a decode's with drafts, see `_query_rows`)."""
        chunks = self._prefill_chunks
        assert self._decode_kernel is not None and chunks is not None
        num_chunks, chunk = chunks.token_limits.shape
        num_heads, head_dim = query.shape[1:]
        group = num_heads // self.num_kv_heads
        limits, starts = self._kernel_rows("prefill", chunks.token_limits, group, window)
        rows = query.index_select(0, chunks.cells).view(num_chunks, chunk, self.num_kv_heads, group, head_dim)
        rows = rows.permute(0, 2, 3, 1, 4).reshape(num_chunks, self.num_kv_heads, group * chunk, head_dim).contiguous()
        row_sinks = _row_sinks(sinks, self.num_kv_heads, chunk)
        out = self._decode_kernel(rows, cache, chunks.block_table, limits, head_dim**-0.5, starts, row_sinks)
        out = out.view(num_chunks, self.num_kv_heads, group, chunk, head_dim).permute(0, 3, 1, 2, 4)
        return out.reshape(num_chunks * chunk, num_heads, head_dim).index_select(0, chunks.token_cells)


def _row_sinks(sinks: torch.Tensor | None, num_kv_heads: int, num_tokens: int) -> torch.Tensor | None:
    """Each query head's sink logit [H] per (query head, token) row of its KV head: float32 [KVH, group × Q]
    (rows as `_query_rows` lays them out)."""
    if sinks is None:
        return None
    return sinks.float().view(num_kv_heads, -1, 1).expand(-1, -1, num_tokens).reshape(num_kv_heads, -1).contiguous()


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
