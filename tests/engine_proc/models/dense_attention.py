"""A cacheless attention backend for tests: causal attention within each sequence of a flat batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class DenseCausalAttention:
    """Attends causally inside each of the concatenated sequences (lengths given), no KV cache."""

    def __init__(self, seq_lens: list[int]) -> None:
        self.seq_lens = seq_lens

    def rotate_and_store(self, layer_idx: int, qkv: Tensor, rotary_table: Tensor) -> tuple[Tensor, Tensor] | None:
        return None  # nothing to store: the model rotates

    def forward(
        self, layer_idx: int, query: Tensor, key: Tensor, value: Tensor, is_stored: bool = False,
        window: int | None = None,
    ) -> Tensor:
        if window is not None:
            raise NotImplementedError("the dense test backend attends over whole sequences only")
        if sum(self.seq_lens) != query.shape[0]:
            raise ValueError(f"sequence lengths {self.seq_lens} do not add up to {query.shape[0]} tokens")
        num_queries_per_kv = query.shape[1] // key.shape[1]
        outputs = []
        queries, keys, values = (x.split(self.seq_lens) for x in (query, key, value))
        for q, k, v in zip(queries, keys, values, strict=True):
            k = k.repeat_interleave(num_queries_per_kv, dim=1)
            v = v.repeat_interleave(num_queries_per_kv, dim=1)
            # [tokens, heads, dim] -> [heads, tokens, dim] for SDPA, and back.
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
            )
            outputs.append(out.transpose(0, 1))
        return torch.cat(outputs)
