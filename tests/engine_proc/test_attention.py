"""Paged attention against dense causal attention over each sequence's whole K/V."""

from __future__ import annotations

import psutil
import pytest
import torch

from engine_proc.attention import PagedAttention
from tests.engine_proc.attention_cases import decode_step, mixed_step


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


@pytest.mark.parametrize("window", [1, 3, 8])
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 4, 2, 3]])
def test_a_window_limits_decodes_and_drafts_to_their_last_keys(query_lens: list[int], window: int) -> None:
    out, expected = decode_step(query_lens, window=window)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("is_kernel_allowed", [True, False])
@pytest.mark.parametrize(
    ("decode_contexts", "spans", "window"),
    [
        ([40, 7, 300], [(32, 45), (0, 100)], 32),  # some contexts within the window, some past it
        ([12], [(47, 1), (512, 64)], 512),  # Gemma 3's window: a long prompt after a cached prefix
        ([600], [(0, 30)], 16),  # a decode far past the window beside a prompt shorter than it
    ],
)
def test_a_window_limits_prompts_and_decodes_in_one_step(
    decode_contexts: list[int], spans: list[tuple[int, int]], window: int, is_kernel_allowed: bool
) -> None:
    out, expected = mixed_step(decode_contexts, spans, window=window, is_kernel_allowed=is_kernel_allowed)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
    whole, _ = mixed_step(decode_contexts, spans, is_kernel_allowed=is_kernel_allowed)
    assert not torch.equal(out, whole)  # NOTE: the window changed what some token sees


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("query_lens", [[1, 1, 1], [1, 4, 2, 3], [1] * 20])
def test_attention_sinks_join_each_heads_softmax_in_decodes_and_drafts(query_lens: list[int], window: int | None) -> None:
    """gpt-oss's sinks, alone and with its sliding window, on the torch path (float32); 20 decodes take its matmuls."""
    out, expected = decode_step(query_lens, window=window, has_sinks=True)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    without, _ = decode_step(query_lens, window=window)
    assert not torch.allclose(out, without, rtol=1e-2, atol=1e-2)  # NOTE: the sinks took weight off the values


@pytest.mark.parametrize("is_kernel_allowed", [True, False])
@pytest.mark.parametrize("window", [None, 32])
@pytest.mark.parametrize(
    ("decode_contexts", "spans"),
    [([40, 7, 300], [(32, 45), (0, 100)]), ([600], [(0, 30)]), ([], [(0, 230)])],
)
def test_attention_sinks_join_each_heads_softmax_in_prompts_and_decodes(
    decode_contexts: list[int], spans: list[tuple[int, int]], window: int | None, is_kernel_allowed: bool
) -> None:
    out, expected = mixed_step(decode_contexts, spans, window=window, has_sinks=True, is_kernel_allowed=is_kernel_allowed)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
    without, _ = mixed_step(decode_contexts, spans, window=window, is_kernel_allowed=is_kernel_allowed)
    assert not torch.allclose(out, without, rtol=1e-1, atol=1e-1)


@pytest.mark.parametrize("is_kernel_allowed", [True, False])
@pytest.mark.parametrize(("earlier", "window"), [(128, None), (None, 128)])
def test_layers_with_and_without_a_window_share_a_step(is_kernel_allowed: bool, earlier: int | None, window: int | None) -> None:
    """gpt-oss: sinks in every layer, a 128-token window in every other one, all of them on one step's metadata."""
    decode_contexts, spans = [40, 300], [(100, 60), (0, 200)]
    out, expected = mixed_step(
        decode_contexts, spans, window=window, has_sinks=True, is_kernel_allowed=is_kernel_allowed, earlier_windows=(earlier,)
    )
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)
