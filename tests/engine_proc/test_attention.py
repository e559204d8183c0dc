"""Paged attention against dense causal attention over each sequence's whole K/V."""

from __future__ import annotations

import psutil
import pytest
import torch

from engine_proc.attention import PagedAttention
from tests.engine_proc.attention_cases import decode_step


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [3, 3], [1, 4, 2, 3], [5]])
def test_decodes_with_draft_tokens_attend_like_dense_causal_attention(query_lens: list[int]) -> None:
    out, expected = decode_step(query_lens)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_new_cache_reads_as_zeros_and_takes_memory_only_as_it_is_written(dtype: torch.dtype) -> None:
    # NOTE: 8 layers of 2 x 4 heads x 65,536 slots x 64: 1 GiB in float32, half in bfloat16.
    process = psutil.Process()
    before = process.memory_info().rss
    attention = PagedAttention(8, 65_536, 4, 64, 16, dtype, torch.device("cpu"))
    cache_bytes = sum(cache.numel() * cache.element_size() for cache in attention.kv_caches)
    assert all(cache.dtype == dtype and int(torch.count_nonzero(cache)) == 0 for cache in attention.kv_caches)
    assert process.memory_info().rss - before < cache_bytes / 8
    attention.kv_caches[0][:, :, :4096].fill_(1.0)  # the first 256 blocks of one layer
    assert process.memory_info().rss - before < cache_bytes / 8 + attention.kv_caches[0].nbytes
    attention.free_cache()
