"""The contract between the model and whatever stores K/V and attends."""

from __future__ import annotations

from typing import Protocol

from torch import Tensor


class AttentionBackend(Protocol):
    """Causal attention over a flat batch of tokens from several sequences.

    The model calls `forward` once per layer with the rotary embedding already applied.
    The backend knows which tokens belong to which sequence, stores K/V (e.g. in a paged
    cache) and attends causally within each sequence, with softmax scale `head_dim ** -0.5`
    and grouped-query attention (query head h reads kv head h // num_queries_per_kv).
    """

    def forward(self, layer_idx: int, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        """Attend: query [num_tokens, num_heads, head_dim], key/value [num_tokens, num_kv_heads, head_dim].

        Returns [num_tokens, num_heads, head_dim] in the query's dtype.
        """
        ...
