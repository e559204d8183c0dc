"""Greedy picks straight from an output head (the AMX kernel): the argmax of the bf16 logits
without writing [rows, vocab_size] out, kept only where it measures faster than the plain head."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from engine_proc.cpu.argmax import greedy_ids
from engine_proc.cpu.kernels import has_amx
from engine_proc.cpu.matmul_forms import is_faster

logger = logging.getLogger(__name__)

# Rows at which it is measured: the fewest it takes (below, reading the weight dominates either
# way) and a big decode batch.
_MEASURED_ROWS = (16, 256)


class GreedyHead:
    """An output head's weight in the kernel's AMX tile layout, for batches of at least `min_rows` rows."""

    min_rows = _MEASURED_ROWS[0]

    def __init__(self, kernels: Any, weight: Tensor) -> None:
        self._kernels = kernels
        self.weight = kernels.pack_greedy_head(weight)
        self.vocab_size, self.hidden_size = weight.shape

    def greedy_ids(self, hidden: Tensor) -> Tensor:
        """Each row's first argmax of bf16(hidden @ weight.T)."""
        token_ids: Tensor = self._kernels.greedy_head(hidden, self.weight, self.vocab_size)
        return token_ids

    @classmethod
    def if_faster(cls, kernels: Any, weight: Tensor, raw_logits: Callable[[Tensor], Tensor]) -> GreedyHead | None:
        """The head where it beats `greedy_ids(raw_logits(hidden))` by 20% at both measured row counts
        (at the default model's width, 576, the two are close: 2.9 vs 2.3 ms at 16 rows, 22 vs 19 at
        256; at width 64, 2.5 vs 7-10 ms at 256); None without AMX, or where Linux refuses its tiles."""
        if not has_amx() or not hasattr(kernels, "greedy_head") or weight.dtype != torch.bfloat16 or weight.shape[1] % 32:
            return None
        head = cls(kernels, weight)
        try:
            is_kept = all(head.is_faster_at(num_rows, raw_logits) for num_rows in _MEASURED_ROWS)
        except RuntimeError as exc:  # NOTE: e.g. a kernel (or container) that refuses AMX tile state
            logger.info("output head: no greedy picks from the head (%s)", exc)
            return None
        if is_kept:
            logger.info("output head: greedy picks from %d rows straight from the head (AMX kernel)", cls.min_rows)
        return head if is_kept else None

    def is_faster_at(self, num_rows: int, raw_logits: Callable[[Tensor], Tensor]) -> bool:
        hidden = torch.randn(num_rows, self.hidden_size, dtype=torch.bfloat16, device=self.weight.device)
        return is_faster(lambda: self.greedy_ids(hidden), lambda: greedy_ids(raw_logits(hidden)), margin=1.2)
