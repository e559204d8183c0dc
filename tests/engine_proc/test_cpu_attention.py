"""The C++ decode attention kernel against dense attention and against the gather + SDPA path it replaces."""

from __future__ import annotations

import pytest
import torch

from engine_proc import cpu_attention
from engine_proc.cpu_attention import load_decode_kernel
from tests.engine_proc.test_attention import decode_step

# The default model's attention: 9 query heads over 3 KV heads of 64, blocks of 16.
SMOLLM2 = dict(dtype=torch.bfloat16, num_heads=9, num_kv_heads=3, head_dim=64, block_size=16, max_context_len=150)

needs_kernel = pytest.mark.skipif(load_decode_kernel() is None, reason="this CPU has no AVX-512 BF16 (or no compiler)")


@needs_kernel
@pytest.mark.parametrize("query_lens", [[1], [1, 1, 1, 1, 1], [8], [1, 8, 3, 5], [2, 2]])
def test_kernel_attends_like_dense_attention_and_like_the_sdpa_path(query_lens: list[int]) -> None:
    out, expected = decode_step(query_lens, **SMOLLM2)
    sdpa_out, _ = decode_step(query_lens, **SMOLLM2, is_kernel_allowed=False)
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    # NOTE: bfloat16 inputs, float32 sums in both; outputs differ by bfloat16 rounding only.
    torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)
    torch.testing.assert_close(out, sdpa_out, rtol=0.02, atol=0.02)
    assert (out.float() - sdpa_out.float()).abs().mean() < 1e-3


@needs_kernel
def test_a_context_of_many_blocks_with_a_partly_filled_last_block() -> None:
    out, expected = decode_step([1, 4], **{**SMOLLM2, "max_context_len": 900})
    torch.testing.assert_close(out.float(), expected, rtol=0.02, atol=0.02)


def test_float32_keeps_the_exact_path() -> None:
    from engine_proc.attention import PagedAttention

    attention = PagedAttention(1, 64 * 16, 3, 64, 16, torch.float32, torch.device("cpu"))
    assert attention._decode_kernel is None


def test_the_kernel_can_be_switched_off_and_is_not_tried_on_other_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    build = load_decode_kernel.__wrapped__
    monkeypatch.setenv("ZEROSERVE_CPU_KERNELS", "0")
    assert build() is None
    monkeypatch.delenv("ZEROSERVE_CPU_KERNELS")
    monkeypatch.setattr(cpu_attention, "_cpu_flags", lambda: {"avx2", "fma"})
    assert build() is None
