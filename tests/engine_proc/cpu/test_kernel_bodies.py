"""The C++ kernels' AVX-512 and AVX2 bodies give the same bits (vec16.h says how): a machine's answers do
not depend on which of the two its CPU runs.

On any AVX2 CPU the AVX-512 bodies are built through SIMDe (SIMD Everywhere, Debian's libsimde-dev: each
AVX-512 intrinsic as AVX2 code) beside the AVX2 build, and every kernel's output is compared bit for bit
on random inputs; on an AVX-512 CPU its own build is compared too. SIMDe computes each instruction as
Intel defines it, so this holds the arithmetic the bodies ask for (the same operations in the same order),
which is why the kernels use no instruction whose rounding is the CPU's own: `vdpbf16ps` (flushes
subnormals, and SIMDe 0.7 sums its pairs in another order than Intel's manual), `vcvtneps2bf16`, rcp14.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_proc.cpu import kernels as cpu_kernels
from engine_proc.cpu.features import cpu_features
from engine_proc.cpu.form_registry import FORMS
from engine_proc.cpu.weight_blocks import (
    Blocks,
    IQ4XSBlocks,
    MXFP4Blocks,
    Q4Blocks,
    Q4KBlocks,
    Q5Blocks,
    Q5KBlocks,
    Q6KBlocks,
    Q8Blocks,
)
from engine_proc.models.llama import RMSNorm
from proto import envs

SIMDE_HEADER = Path("/usr/include/simde/x86/avx512.h")
EXTRAS = Path(__file__).parent / "simde" / "simde_extras.h"

pytestmark = pytest.mark.skipif(
    not cpu_features().has_avx2 or shutil.which("g++") is None or not envs.cpu_kernels(),
    reason="the kernels' AVX2 build needs an x86 CPU with AVX2, g++ and ZEROSERVE_CPU_KERNELS on",
)


def _avx2_build() -> Any:
    """The engine's own AVX2 build where it runs here (cached), else one at -O1 (same arithmetic, built sooner)."""
    if cpu_features().kernel_isa == "avx2":
        return cpu_kernels.build_or_import("zeroserve_cpu_kernels_avx2", cpu_kernels._SOURCES, cpu_kernels._CFLAGS_BY_ISA["avx2"])
    cflags = [*cpu_kernels._CFLAGS_BY_ISA["avx2"], "-O1"]
    return cpu_kernels.build_or_import("zeroserve_cpu_kernels_avx2_o1", cpu_kernels._SOURCES, cflags)


def _simde_build() -> Any:
    if not SIMDE_HEADER.exists():
        pytest.skip(f"no SIMDe headers ({SIMDE_HEADER}: apt-get install libsimde-dev)")
    # NOTE: -fno-tree-sra: GCC 12 stops with an internal error on SIMDe's 512-bit unions in attention without it.
    # NOTE: -O1 builds in a third of -O3's time; without contraction or fast-math the arithmetic is the same.
    cflags = ["-mavx2", "-mfma", "-mf16c", "-DZEROSERVE_SIMDE_AVX512", "-fno-tree-sra", f"-I{EXTRAS.parent}", "-O1"]
    try:
        return cpu_kernels.build_or_import("zeroserve_cpu_kernels_simde_avx512", cpu_kernels._SOURCES, cflags, (EXTRAS,))
    except Exception as exc:  # noqa: BLE001 - a SIMDe this build does not go with is a skip, named
        pytest.skip(f"the AVX-512 bodies did not build through SIMDe: {str(exc)[-300:]}")


def _bodies() -> list[str]:
    return ["simde", "native"] if cpu_features().kernel_isa == "avx512_bf16" else ["simde"]


@pytest.fixture(scope="module")
def avx2() -> Any:
    return _avx2_build()


@pytest.fixture(scope="module", params=_bodies())
def avx512(request: pytest.FixtureRequest) -> Any:
    if request.param == "native":
        return cpu_kernels.load_cpu_kernels()
    return _simde_build()


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                                              b.view(torch.int16) if b.dtype == torch.bfloat16 else b)


def _rows(num_rows: int, width: int, seed: int) -> torch.Tensor:
    """bfloat16 rows spanning six orders of magnitude, with zeros, subnormals and both signs."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_rows, width, generator=generator) * torch.logspace(-3, 3, num_rows).unsqueeze(1)
    x[0, :16] = torch.tensor([0.0, -0.0, 1e-39, -1e-39, 3e-40, 1e-45, 5.0, -5.0, 60.0, -60.0, 100.0, -100.0, 1.0, -1.0, 0.5, 2.0])
    return x.bfloat16()


def test_the_elementwise_kernels(avx2: Any, avx512: Any) -> None:
    x, other = _rows(37, 640, 1), _rows(37, 640, 2)
    weight = _rows(1, 640, 3)[0]
    assert _same_bits(avx2.rms_norm(x, weight, 1e-6), avx512.rms_norm(x, weight, 1e-6))
    residuals = [other.clone(), other.clone()]
    normed = [kernels.add_rms_norm(x, residual, weight, 1e-6) for kernels, residual in zip((avx2, avx512), residuals, strict=True)]
    assert _same_bits(*normed) and _same_bits(*residuals)
    assert _same_bits(avx2.silu_and_mul(x), avx512.silu_and_mul(x))


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_rotary_and_the_cache_write(avx2: Any, avx512: Any, head_dim: int) -> None:
    num_tokens, num_heads, num_kv_heads = 9, 4, 2
    qkv = _rows(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, 4)
    angles = torch.rand(num_tokens, head_dim // 2, generator=torch.Generator().manual_seed(5)) * 100
    table = torch.cat((angles.cos(), angles.cos(), -angles.sin(), angles.sin()), dim=-1).bfloat16()
    slots = torch.randperm(64, generator=torch.Generator().manual_seed(6))[:num_tokens]
    norms = (_rows(1, head_dim, 7)[0], _rows(1, head_dim, 8)[0], 1e-6)
    for head_norms in ((None, None, 0.0), norms):
        outs = []
        for kernels in (avx2, avx512):
            cache = torch.zeros(2, num_kv_heads, 64, head_dim, dtype=torch.bfloat16)
            outs.append((*kernels.rotary_store_kv(qkv, table, slots, cache, num_heads, *head_norms), cache))
        assert all(_same_bits(a, b) for a, b in zip(*outs, strict=True))


@pytest.mark.parametrize(("head_dim", "num_rows"), [(64, 3), (80, 5), (128, 1), (256, 4), (256, 9)])
def test_paged_decode_attention(avx2: Any, avx512: Any, head_dim: int, num_rows: int) -> None:
    """Several sequences of up to 300 keys (a partly filled last block), rows that see fewer keys
    than their sequence holds (a prompt's chunk), scores of both signs and wide range; then rows that
    start at other keys (a sliding window) and sink logits."""
    generator = torch.Generator().manual_seed(head_dim + num_rows)
    num_seqs, num_kv_heads, num_blocks, max_blocks = 3, 2, 64, 19
    cache = (torch.randn(2, num_kv_heads, num_blocks * 16, head_dim, generator=generator) * 3).bfloat16()
    query = (torch.randn(num_seqs, num_kv_heads, num_rows, head_dim, generator=generator) * 2).bfloat16()
    block_table = torch.stack([torch.randperm(num_blocks, generator=generator)[:max_blocks] for _ in range(num_seqs)])
    row_limits = torch.randint(1, max_blocks * 16 + 1, (num_seqs, num_rows), generator=generator)
    row_limits[0, 0] = 1
    for scale in (head_dim**-0.5, 1.0 / 16):
        outs = [kernels.paged_decode_attention(query, cache, block_table, row_limits, scale) for kernels in (avx2, avx512)]
        assert _same_bits(*outs)
    # A sliding window (each row's first key up to 79 keys before its limit, mid-block; at it, a row that sees none)
    # and attention sinks.
    row_starts = (row_limits - torch.randint(0, 80, (num_seqs, num_rows), generator=generator)).clamp(min=0)
    row_sinks = torch.randn(num_kv_heads, num_rows, generator=generator) * 4
    for starts, sinks in ((row_starts, None), (None, row_sinks), (row_starts, row_sinks)):
        outs = [
            kernels.paged_decode_attention(query, cache, block_table, row_limits, head_dim**-0.5, starts, sinks)
            for kernels in (avx2, avx512)
        ]
        assert _same_bits(*outs)


def _blocks(form: str, rows: int, cols: int) -> Blocks:
    """Random blocks of the form's kind, as a GGUF holds them (float16-exact scales)."""
    g = torch.Generator().manual_seed(len(form))

    def codes(top: int) -> torch.Tensor:
        return torch.randint(0, top, (rows, cols), dtype=torch.uint8, generator=g)

    def halves(per: int, low: float, span: float) -> torch.Tensor:
        return (torch.rand(rows, cols // per, generator=g) * span + low).half().float()

    def small_ints(per: int, low: int, high: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randint(low, high, (rows, cols // per), generator=g).to(dtype)

    if form in ("int4_q8", "int5_q8"):
        kind = Q4Blocks if form == "int4_q8" else Q5Blocks
        return kind(codes(16 if form == "int4_q8" else 32), halves(32, 1e-3, 0.02), -halves(32, 0.0, 0.2))
    if form in ("int4k_q8", "int5k_q8"):
        kind_k = Q4KBlocks if form == "int4k_q8" else Q5KBlocks
        return kind_k(codes(16 if form == "int4k_q8" else 32), small_ints(32, 1, 64, torch.uint8),
                      small_ints(32, 0, 64, torch.uint8), halves(256, 1e-4, 1e-3), halves(256, 0.0, 1e-3))
    if form == "int6k_q8":
        return Q6KBlocks(codes(64), small_ints(16, -128, 128, torch.int8), halves(256, 1e-4, 1e-3))
    if form == "iq4xs_q8":
        return IQ4XSBlocks(codes(16), small_ints(32, -32, 32, torch.int8), halves(256, 1e-4, 1e-3))
    if form == "mxfp4_q8":
        exponents = small_ints(32, 110, 140, torch.uint8)
        exponents[0, :4] = torch.tensor([0, 1, 2, 252], dtype=torch.uint8)  # subnormal steps, the largest one taken
        return MXFP4Blocks(codes(16), exponents)
    assert form == "int8_q8", form
    signed = torch.randint(-127, 128, (rows, cols), generator=g).to(torch.int8)
    return Q8Blocks(signed, halves(32, 1e-4, 1e-2))


_FORMS = ("int4_q8", "int4k_q8", "int5_q8", "int5k_q8", "int6k_q8", "iq4xs_q8", "mxfp4_q8", "int8_q8")


def test_every_kernel_form_has_its_blocks_here() -> None:
    assert sorted(_FORMS) == sorted(name for name, spec in FORMS.items() if spec.kernel is not None)


@pytest.mark.parametrize("form", _FORMS)
def test_the_matmul_forms(avx2: Any, avx512: Any, form: str) -> None:
    ops = FORMS[form].kernel
    assert ops is not None
    blocks = _blocks(form, 48, 512)
    for num_rows in (1, 3, 16):
        x = _rows(num_rows, 512, num_rows)
        outs = [ops.run(kernels)(x, *ops.pack(kernels, blocks)) for kernels in (avx2, avx512)]
        assert _same_bits(*outs)


def test_per_head_norms_run_through_the_kernel(avx2: Any) -> None:
    """Gemma's and Qwen3's query and key norms ([tokens, heads, head_dim], a slice of the projection) take
    the kernel's rows, not torch's sum of squares (whose order follows the CPU's vector width)."""
    norm = RMSNorm(256, 1e-6).to(torch.bfloat16)
    norm.weight.data = _rows(1, 256, 9)[0]
    norm.kernels = avx2
    qkv = _rows(2000, 6 * 256, 10)  # NOTE: enough rows that torch's sums would land a value a step away
    heads = qkv[:, : 4 * 256].view(2000, 4, 256)
    expected = avx2.rms_norm(heads.reshape(-1, 256).contiguous(), norm.weight, 1e-6).view(2000, 4, 256)
    assert _same_bits(norm(heads), expected)


def test_torch_gelu_held_to_avx2_is_at_most_one_bfloat16_step_away() -> None:
    """Gemma's MLP takes torch's GELU (tanh), not ours: its tanh is Sleef's at the CPU's vector width. The
    same algorithm at both widths should give the same bits; what this holds is the bound that matters
    for answers, at most one bfloat16 step from the bits torch held to AVX2 gives (the gemma fidelity
    test holds the answers themselves)."""
    if cpu_features().capability != "AVX512":
        pytest.skip(f"torch runs its AVX2 kernels here already ({cpu_features().describe()})")
    x = _rows(64, 2048, 11)
    script = (
        "import sys, torch; x = torch.load(sys.argv[1]); "
        "torch.save(torch.nn.functional.gelu(x, approximate='tanh'), sys.argv[1])"
    )
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "x.pt"
        torch.save(x, path)
        env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
        subprocess.run([sys.executable, "-c", script, str(path)], env=env, check=True, timeout=120)
        held = torch.load(path)
    ours = torch.nn.functional.gelu(x, approximate="tanh")
    assert ours.dtype == held.dtype == torch.bfloat16
    steps = (ours.view(torch.int16).int() - held.view(torch.int16).int()).abs()
    steps = torch.where(ours == held, 0, steps)  # NOTE: -0 and +0 are one value
    assert int(steps.max()) <= 1, f"{int((steps > 0).sum())} of {steps.numel()} values differ, by up to {int(steps.max())} steps"
