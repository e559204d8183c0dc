"""The C++ kernels against the torch ops they replace: decode attention (also against dense attention), RMSNorm, SiLU·up."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine_proc import cpu_kernels
from engine_proc.cpu_kernels import load_cpu_kernels
from engine_proc.loader import load_model
from tests.engine_proc.models.test_llama import TINY, run, save_tiny_checkpoint
from tests.engine_proc.test_attention import decode_step

# The default model's attention: 9 query heads over 3 KV heads of 64, blocks of 16.
SMOLLM2 = dict(dtype=torch.bfloat16, num_heads=9, num_kv_heads=3, head_dim=64, block_size=16, max_context_len=150)

needs_kernel = pytest.mark.skipif(load_cpu_kernels() is None, reason="this CPU has no AVX-512 BF16 (or no compiler)")


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
    build = load_cpu_kernels.__wrapped__
    monkeypatch.setenv("ZEROSERVE_CPU_KERNELS", "0")
    assert build() is None
    monkeypatch.delenv("ZEROSERVE_CPU_KERNELS")
    monkeypatch.setattr(cpu_kernels, "_cpu_flags", lambda: {"avx2", "fma"})
    assert build() is None


@needs_kernel
@pytest.mark.parametrize("num_rows", [1, 7, 130])
def test_fused_norm_and_swiglu_give_torchs_bfloat16_results(num_rows: int) -> None:
    kernels = load_cpu_kernels()
    torch.manual_seed(num_rows)
    x, weight = torch.randn(num_rows, 576).bfloat16(), torch.randn(576).bfloat16()
    x_float = x.float()
    normed = (x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + 1e-5)).bfloat16()
    fused, expected = kernels.rms_norm(x, weight, 1e-5), weight * normed
    # NOTE: the same roundings, but the sum of squares in another order: now and then a value
    # lands one bfloat16 step away (2 in 75,000 here).
    assert (fused != expected).float().mean() < 1e-3
    torch.testing.assert_close(fused, expected, rtol=2**-7, atol=0)
    gate_up = torch.randn(num_rows, 2 * 1536).bfloat16() * 4
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.equal(kernels.silu_and_mul(gate_up), torch.nn.functional.silu(gate) * up)


@needs_kernel
def test_a_bfloat16_model_gives_the_logits_it_gives_without_the_fused_layers(tmp_path: Path) -> None:
    save_tiny_checkpoint(tmp_path, "qwen3-qk-norm")  # per-head q/k norms: 3-D, left to torch
    model = load_model(tmp_path, dtype=torch.bfloat16)
    assert model.model.norm.kernels is not None and model.model.layers[0].mlp.kernels is not None
    seqs = [torch.randint(0, TINY["vocab_size"], (n,)) for n in (9, 1, 30)]
    with torch.no_grad():
        fused = run(model, seqs)
        for module in model.modules():
            if hasattr(module, "kernels"):
                module.kernels = None
        torch.testing.assert_close(fused, run(model, seqs), atol=0.02, rtol=0)
