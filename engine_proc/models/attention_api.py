"""The contract between the model and whatever stores K/V and attends."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from torch import Tensor


class HeadNorms(NamedTuple):
    """Per-head RMS norms of the queries and keys (Qwen3's), for a fused rotary pass."""

    query_weight: Tensor
    key_weight: Tensor
    eps: float


class DecodeStep(NamedTuple):
    """What the C++ layers (cpu/csrc/decoder_layers.cpp) read and write of the paged cache in a step of one-token
    decodes: each token's slot, each layer's cache, and each decode's blocks and keys as the paged kernel takes them."""

    slot_mapping: Tensor  # [num_tokens]
    kv_caches: list[Tensor]  # a layer's [2, kv_heads, num_slots, head_dim]
    block_table: Tensor  # [num_tokens, max_blocks]
    row_limits: Tensor  # [num_tokens, group]: how many keys each query head sees
    scale: float


class AttentionBackend(Protocol):
    """Causal attention over a flat batch of tokens from several sequences.

    The model calls `forward` once per layer with the rotary embedding already applied
    (by itself, or by `rotate_and_store`).
    The backend knows which tokens belong to which sequence, stores K/V (e.g. in a paged
    cache) and attends causally within each sequence, with softmax scale `head_dim ** -0.5`
    and grouped-query attention (query head h reads kv head h // num_queries_per_kv).
    """

    def forward(
        self, layer_idx: int, query: Tensor, key: Tensor, value: Tensor, is_stored: bool = False,
        window: int | None = None, sinks: Tensor | None = None,
    ) -> Tensor:
        """Attend: query [num_tokens, num_heads, head_dim], key/value [num_tokens, num_kv_heads, head_dim].

        Stores key and value first unless `rotate_and_store` already has (`is_stored`). With a
        `window`, a token at position p attends only to keys at positions p - window + 1 to p.
        With `sinks` [num_heads] (gpt-oss's attention sinks: a learned logit per query head, in the
        scaled scores' units), head h's softmax takes exp(sinks[h]) as one more term of its
        denominator, a column that weighs no value (so a row's weights may sum to less than 1).
        Returns [num_tokens, num_heads, head_dim] in the query's dtype.
        """
        ...

    def rotate_and_store(
        self, layer_idx: int, qkv: Tensor, rotary_table: Tensor, head_norms: HeadNorms | None = None
    ) -> tuple[Tensor, Tensor] | None:
        """Where the backend has a fused pass for it: rotary on the queries and keys of a fused
        projection's output qkv [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], keys and
        values stored, and the rotated (query, key) returned; None where it has none (the model then
        rotates with torch ops). rotary_table [num_tokens, 2 * head_dim] holds each token's
        (cos, cos, -sin, sin), halves rotated as Hugging Face's rotate_half does. With head_norms, each
        query and key head is RMS-normed first (Qwen3's per-head norms).
        """
        ...

    def decode_step(self, group: int) -> DecodeStep | None:
        """Where this step's tokens are each one decode's one new token and the backend's C++ kernels store and
        attend them in a paged cache, what those kernels take (`group` query heads a KV head); else None."""
        ...
