"""Each row's first argmax, found faster than torch's `max(dim=-1)`: greedy sampling's pick, and the
baseline the output head's own greedy kernel must beat."""

from __future__ import annotations

import torch

from engine_proc.cpu.kernels import load_cpu_kernels

_ARGMAX_BLOCK = 128


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax (its first maximum): the ids of `logits.max(dim=-1)`, found faster.

    Two levels: the best block of 128 by `amax` (vectorized, where max-with-indices is not),
    then the best within it. 16-bit floats are compared as their int16 bit patterns, which
    order positive values as the floats do; a row whose maximum is not above +0 is redone in
    float32. On 2 cores, [256, 49152]: bfloat16 `max(dim=-1)` 7.1 ms, float32 12.3 ms; this
    1.8 ms from float32 and under 1 ms from bfloat16, with the same ids. Where the C++ kernels run, bfloat16 rows
    go to their `argmax_rows` (one stream's pick: 9 torch ops, 0.1 ms of a 3 ms step, in one call).
    """
    if logits.dtype == torch.bfloat16 and logits.device.type == "cpu" and logits.dim() == 2 and logits.shape[-1]:
        kernels = load_cpu_kernels()
        if kernels is not None:
            return kernels.argmax_rows(logits.contiguous())
    if logits.dtype in (torch.bfloat16, torch.float16) and logits.shape[-1] >= 2 * _ARGMAX_BLOCK:
        token_ids, max_bits = _two_level_argmax(logits.view(torch.int16))
        is_redone = max_bits <= 0
        if bool(is_redone.any()):
            token_ids[is_redone] = _two_level_argmax(logits[is_redone].float())[0]
        return token_ids
    return _two_level_argmax(logits)[0]


def _two_level_argmax(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first argmax, max) of each row of `values` [rows, n]."""
    num_rows, vocab_size = values.shape
    num_blocks = vocab_size // _ARGMAX_BLOCK
    if num_blocks < 2:
        best = values.max(dim=-1)
        return best.indices, best.values
    blocks = values[:, : num_blocks * _ARGMAX_BLOCK].view(num_rows, num_blocks, _ARGMAX_BLOCK)
    best_blocks = blocks.amax(dim=-1).max(dim=-1)
    rows = torch.arange(num_rows, device=values.device)
    token_ids = best_blocks.indices * _ARGMAX_BLOCK + blocks[rows, best_blocks.indices].max(dim=-1).indices
    if num_blocks * _ARGMAX_BLOCK == vocab_size:
        return token_ids, best_blocks.values
    tail = values[:, num_blocks * _ARGMAX_BLOCK :].max(dim=-1)
    # NOTE: the blocks come first, so the tail wins only when strictly greater.
    is_tail = tail.values > best_blocks.values
    return (
        torch.where(is_tail, tail.indices + num_blocks * _ARGMAX_BLOCK, token_ids),
        torch.maximum(tail.values, best_blocks.values),
    )
