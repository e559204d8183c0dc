"""The forms a linear layer keeps its weight in: the GGUF's 4-bit blocks by torch's int4 kernel and by
zeroserve's integer products with 8-bit activations (int4_q8), 8-bit blocks (int8_q8), against the
dequantized weights' matmul; the other forms; and every form that claims row invariance held to it."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from engine_proc.cpu.features import cpu_features
from engine_proc.cpu.form_registry import FORMS
from engine_proc.cpu.kernels import load_cpu_kernels
from engine_proc.cpu.matmul_plan import plan_linears
from engine_proc.cpu.policy import FASTEST
from engine_proc.cpu.quantized_linear import INT4_MAX_TOKENS, Linear, kernel_form, parts_form
from engine_proc.cpu.torch_forms import PackedWeight
from engine_proc.cpu.weight_blocks import (
    IQ4_VALUES,
    IQ4XSBlocks,
    MXFP4Blocks,
    Q4Blocks,
    Q4KBlocks,
    Q5Blocks,
    Q5KBlocks,
    Q6KBlocks,
    Q8Blocks,
    cat_blocks,
)
from proto import envs
from tests.engine_proc.cpu.stand_in_timer import stand_in_timer


def random_blocks(rows: int, cols: int, has_min: bool = True) -> Q4Blocks:
    generator = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=generator)
    scales = torch.rand(rows, cols // 32, generator=generator) * 0.02 + 0.001
    mins = -torch.rand(rows, cols // 32, generator=generator) * 0.2 if has_min else -8 * scales
    # NOTE: GGUF stores scales and minimums as float16.
    return Q4Blocks(codes, scales.half().float(), mins.half().float())


def int4_linear(blocks: Q4Blocks, bias: bool = False) -> Linear:
    rows, cols = blocks.codes.shape
    linear = Linear(cols, rows, bias=bias).to(torch.bfloat16).requires_grad_(False)
    linear.weight.copy_(blocks.dequantize())
    linear.set_blocks(blocks, torch.bfloat16)
    linear.kernels = load_cpu_kernels()
    return linear


needs_kernels = pytest.mark.skipif(
    load_cpu_kernels() is None,
    reason=f"zeroserve's kernel forms need x86 with AVX2 or AVX-512 BF16 and VNNI, and g++ ({cpu_features().describe()})",
)


@pytest.mark.parametrize("has_min", [True, False], ids=["q4_1", "q4_0"])
@pytest.mark.parametrize("num_tokens", [1, 3, INT4_MAX_TOKENS])
def test_int4_matmul_matches_the_dequantized_weights(has_min: bool, num_tokens: int) -> None:
    blocks = random_blocks(96, 128, has_min)
    linear = int4_linear(blocks)
    x = torch.randn(num_tokens, 128)
    expected = x @ blocks.dequantize().T
    with torch.no_grad():
        out = linear(x.bfloat16()).float()
    # NOTE: within bfloat16 rounding of the activations, scales and zeros (about 2**-8 relative).
    torch.testing.assert_close(out, expected, atol=0.02 * expected.abs().max().item(), rtol=0)
    dense = F.linear(x.bfloat16(), linear.weight).float()
    assert (out - expected).abs().max() <= 2 * (dense - expected).abs().max() + 1e-2


def test_large_batches_run_the_dense_weights() -> None:
    linear = int4_linear(random_blocks(64, 64))
    x = torch.randn(INT4_MAX_TOKENS + 1, 64).bfloat16()
    with torch.no_grad():
        assert torch.equal(linear(x), F.linear(x, linear.weight))


def test_blocks_of_another_shape_are_rejected() -> None:
    linear = Linear(64, 32)
    with pytest.raises(ValueError, match="blocks of shape"):
        linear.set_blocks(random_blocks(32, 96), torch.bfloat16)




@pytest.mark.parametrize("num_tokens", [1, 7, 64, 300])
def test_prepacked_weights_give_the_plain_matmul_bit_for_bit(num_tokens: int) -> None:
    linear = Linear(96, 160, bias=True).to(torch.bfloat16).requires_grad_(False)
    forms = linear.prepack()
    if "packed" not in forms.runs:
        pytest.skip(f"oneDNN has no bfloat16 packing on this CPU ({cpu_features().describe()})")
    assert forms.plan == ((sys.maxsize, "packed"),)
    x = torch.randn(num_tokens, 96).bfloat16()
    with torch.no_grad():
        assert torch.equal(linear(x), F.linear(x, linear.weight, linear.bias))
    linear.unpack()
    assert linear.forms is None


def test_float32_weights_are_not_prepacked() -> None:
    linear = Linear(64, 32).requires_grad_(False)
    assert set(linear.prepack(("packed", "int8", "float32")).runs) == {"dense"}


@pytest.mark.parametrize("num_tokens", [1, 5, 40])
def test_every_form_gives_the_dense_result_within_its_rounding(num_tokens: int) -> None:
    blocks = random_blocks(96, 128)
    linear = int4_linear(blocks)
    forms = linear.prepack(("packed", "int8", "float32"))
    # NOTE: packed where oneDNN has native bfloat16, float32 where it has not: one of the two.
    assert {"dense", "int4", "int8"} < set(forms.runs) and len(forms.runs) == 4
    x = torch.randn(num_tokens, 128).bfloat16()
    expected = x.float() @ blocks.dequantize().T
    with torch.no_grad():
        for form in forms.runs:
            forms.plan = ((sys.maxsize, form),)
            out = linear(x).float()
            # NOTE: int8 rows round each weight to 1/254 of its row's largest; the others round
            # activations and weights (or int4 scales) to bfloat16 only.
            tolerance = (0.03 if form == "int8" else 0.02) * expected.abs().max().item()
            torch.testing.assert_close(out, expected, atol=tolerance, rtol=0, msg=form)


def test_a_packing_that_fails_leaves_the_float32_form(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object, weight: torch.Tensor) -> None:
        raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert")

    monkeypatch.setattr(PackedWeight, "__init__", refuse)
    linear = Linear(64, 32).to(torch.bfloat16).requires_grad_(False)
    forms = linear.prepack(("packed", "int8", "float32"))
    assert set(forms.runs) == {"dense", "float32"}
    x = torch.randn(3, 64).bfloat16()
    with torch.no_grad():
        torch.testing.assert_close(linear(x), F.linear(x, linear.weight), rtol=0.01, atol=0.01)


def q8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] rounded to 8 bits per group of 32 as int4_q8 documents it: (x̂ [M, K/32, 32], a [M, K/32])."""
    groups = x.float().view(x.shape[0], -1, 32)
    max_abs = groups.abs().amax(-1)
    # NOTE: 127 / max as one rounded float32 division (torch's `127.0 / tensor` multiplies by a reciprocal)
    inverse = torch.where(max_abs > 0, (127.0 / max_abs.double()).float(), torch.zeros_like(max_abs))
    return torch.round(groups * inverse.unsqueeze(-1)).clamp(-127, 127), max_abs / 127.0


@needs_kernels
@pytest.mark.parametrize("has_min", [True, False], ids=["q4_1", "q4_0"])
@pytest.mark.parametrize("num_tokens", [1, 5, 8, 9, 16, 17, 40])
def test_int4_q8_rounds_its_inputs_to_8_bits_per_group(has_min: bool, num_tokens: int) -> None:
    blocks = random_blocks(96, 256, has_min)
    linear = int4_linear(blocks)
    forms = linear.prepack(("packed", "int4_q8"))
    assert "int4_q8" in forms.runs
    x = torch.randn(num_tokens, 256).bfloat16()
    x[0, 40] = 30.0  # an outlier: its group's other inputs get coarse steps
    with torch.no_grad():
        forms.plan = ((sys.maxsize, "int4_q8"),)
        out = linear(x).double()
    # What the kernel says it computes, in float64: Σ_g d·a·Σ q·x̂ + m·a·Σ x̂, that is x̂ · w.
    q, a = q8_rows(x)
    codes = blocks.codes.double().view(96, -1, 32)
    products = torch.einsum("mgk,ngk->mng", q.double(), codes)
    sums = q.double().sum(-1) * a.double()
    stated = (products * a.double().unsqueeze(1) * blocks.scales.double()).sum(-1) + sums @ blocks.mins.double().T
    # NOTE: integer products exact, the rest float32 sums, then one bfloat16 rounding (2**-8 relative).
    assert ((out - stated).abs() <= 2**-8 * stated.abs() + 1e-4 * stated.abs().max()).all()
    assert_within_half_a_step_of_each_input(out, x, blocks.dequantize(), a)


def assert_within_half_a_step_of_each_input(out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, a: torch.Tensor) -> None:
    """Against the exact product: no further than half a step of each input's group (a / 2) times the
    weights it meets, then one bfloat16 rounding."""
    expected = x.double() @ weight.double().T
    weights = weight.double().abs().view(weight.shape[0], -1, 32)
    steps = torch.einsum("mg,ngk->mn", a.double() / 2, weights)
    assert ((out - expected).abs() <= steps + 2**-8 * expected.abs() + 1e-4 * expected.abs().max()).all()


@needs_kernels
def test_a_kernel_form_serves_only_blocks_it_takes() -> None:
    odd = random_blocks(32, 64)
    odd = Q4Blocks(odd.codes, odd.scales + 1e-9, odd.mins)  # scales no float16 holds
    assert "int4_q8" not in int4_linear(odd).prepack(("int4_q8",)).runs
    linear = int4_linear(random_blocks(32, 64))
    assert "int4_q8" not in linear.prepack(("packed",)).runs  # not asked for
    assert linear.blocks is None  # the blocks as loaded are not kept past the first prepack
    linear = int4_linear(random_blocks(32, 64))
    assert "int4_q8" in linear.prepack(("int4_q8", "int8_q8")).runs  # and not int8_q8: 4-bit blocks
    assert "int8_q8" not in linear.prepack(("int4_q8", "int8_q8")).runs
    assert "int4_q8" in linear.prepack(("int4_q8",)).runs  # a second prepack (forms forced in tests) keeps it
    linear.unpack()
    assert linear.kernel_runs == {}


@needs_kernels
def test_a_measured_plan_frees_the_packings_it_does_not_use(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_timer(monkeypatch, lambda form: 0.5 if form == "int4" else 1.0)  # torch's int4 wins
    monkeypatch.setenv("ZEROSERVE_PLAN_CACHE", "off")
    envs.read.cache_clear()
    try:
        linear = int4_linear(random_blocks(32, 64))
        plan_linears([("layers.0.o_proj", linear)], ("packed", "int4_q8"), FASTEST)
    finally:
        envs.read.cache_clear()
    assert linear.forms is not None and {form for _, form in linear.forms.plan} == {"int4"}
    assert linear.kernel_runs == {}


def random_q8_weight(rows: int, cols: int) -> torch.Tensor:
    """A weight whose groups of 32 differ in scale by up to 100x, as a real head's do."""
    generator = torch.Generator().manual_seed(1)
    scales = torch.rand(rows, cols // 32, 1, generator=generator) * 0.1 + 0.001
    return (torch.randn(rows, cols // 32, 32, generator=generator) * scales).view(rows, cols)


def random_q5_blocks(rows: int, cols: int, has_min: bool = True) -> Q5Blocks:
    """Q5_1 blocks (Q5_0: the minimum −16 scales), with random_blocks' scales and minimums."""
    blocks = random_blocks(rows, cols, has_min)
    generator = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 32, (rows, cols), dtype=torch.uint8, generator=generator)
    return Q5Blocks(codes, blocks.scales, blocks.mins if has_min else -16 * blocks.scales)


def random_q4k_blocks(rows: int, cols: int, kind: type[Q4KBlocks | Q5KBlocks] = Q4KBlocks) -> Q4KBlocks | Q5KBlocks:
    """Q4_K (Q5_K) blocks as llama-quantize writes them: 6-bit scales and minimums, float16 d and dmin per 256."""
    generator = torch.Generator().manual_seed(4)
    codes = torch.randint(0, 16 if kind is Q4KBlocks else 32, (rows, cols), dtype=torch.uint8, generator=generator)
    scales = torch.randint(1, 64, (rows, cols // 32), dtype=torch.uint8, generator=generator)
    mins = torch.randint(0, 64, (rows, cols // 32), dtype=torch.uint8, generator=generator)
    d = (torch.rand(rows, cols // 256, generator=generator) * 1e-3 + 1e-4).half().float()
    dmin = (torch.rand(rows, cols // 256, generator=generator) * 1e-3).half().float()
    return kind(codes, scales, mins, d, dmin)


def random_q6k_blocks(rows: int, cols: int) -> Q6KBlocks:
    """Q6_K blocks as llama-quantize writes them: 6-bit codes, signed 8-bit scales per 16, a float16 d per 256."""
    generator = torch.Generator().manual_seed(6)
    codes = torch.randint(0, 64, (rows, cols), dtype=torch.uint8, generator=generator)
    scales = torch.randint(-128, 128, (rows, cols // 16), generator=generator).to(torch.int8)
    d = (torch.rand(rows, cols // 256, generator=generator) * 1e-3 + 1e-4).half().float()
    return Q6KBlocks(codes, scales, d)


def random_iq4xs_blocks(rows: int, cols: int) -> IQ4XSBlocks:
    """IQ4_XS blocks: 4-bit indices, signed 6-bit scales per 32, a float16 d per 256."""
    generator = torch.Generator().manual_seed(7)
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=generator)
    scales = torch.randint(-32, 32, (rows, cols // 32), generator=generator).to(torch.int8)
    d = (torch.rand(rows, cols // 256, generator=generator) * 1e-3 + 1e-4).half().float()
    return IQ4XSBlocks(codes, scales, d)


def random_mxfp4_blocks(rows: int, cols: int) -> MXFP4Blocks:
    """MXFP4 blocks as gpt-oss's experts hold them: 4-bit e2m1 codes, exponents of steps 2^-10 .. 2^-3 per 32."""
    generator = torch.Generator().manual_seed(8)
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.uint8, generator=generator)
    exponents = torch.randint(118, 126, (rows, cols // 32), dtype=torch.uint8, generator=generator)
    return MXFP4Blocks(codes, exponents)


def row_invariant_form(form: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The run of each form the registry says is row-invariant, on a random weight of 96 outputs and 256 inputs."""
    if form == "parts":  # NOTE: 32 rows of Q4_K above 16 of Q6_K and 48 of Q4_K again
        parts = [random_q4k_blocks(32, 256), random_q6k_blocks(16, 256), random_q4k_blocks(48, 256)]
        parts_run = parts_form(load_cpu_kernels(), parts)
        assert parts_run is not None
        return parts_run
    spec = FORMS[form]
    assert spec.kernel is not None, f"{form} claims row invariance: give it a case here"
    makers = {
        Q4Blocks: random_blocks, Q5Blocks: random_q5_blocks, Q4KBlocks: random_q4k_blocks,
        Q5KBlocks: lambda n, k: random_q4k_blocks(n, k, Q5KBlocks), Q6KBlocks: random_q6k_blocks,
        IQ4XSBlocks: random_iq4xs_blocks, MXFP4Blocks: random_mxfp4_blocks,
        Q8Blocks: lambda n, k: Q8Blocks.quantize(random_q8_weight(n, k)),
    }
    blocks = makers[spec.kernel.blocks](96, 256)
    run = kernel_form(load_cpu_kernels(), spec, blocks)
    assert run is not None
    return run


@needs_kernels
@pytest.mark.parametrize("form", [spec.name for spec in FORMS.values() if spec.is_row_invariant])
def test_every_form_that_claims_row_invariance_gives_each_row_the_same_bits_at_any_batch_size(form: str) -> None:
    run = row_invariant_form(form)
    generator = torch.Generator().manual_seed(2)
    # NOTE: rows of very different sizes, so a row's rounding could show any mixing with its neighbours'.
    x = (torch.randn(80, 256, generator=generator) * torch.logspace(-2, 2, 80).unsqueeze(1)).bfloat16()
    whole = run(x)
    for num_rows in (1, 3, 16, 64):
        for first in (0, 5, 80 - num_rows):
            part = run(x[first : first + num_rows].contiguous())
            assert torch.equal(part, whole[first : first + num_rows]), f"{form}: rows {first}.. alone in {num_rows}"


@needs_kernels
@pytest.mark.parametrize("num_tokens", [1, 7, 8, 9, 40])
def test_int8_q8_multiplies_8_bit_blocks_by_8_bit_rows_exactly_per_group(num_tokens: int) -> None:
    weight = random_q8_weight(40, 256)  # NOTE: 40 outputs: padded to 48 for the kernel, cut again
    blocks = Q8Blocks.quantize(weight)
    codes = blocks.codes.clone()
    codes[3, :32] = -128  # NOTE: no quantizer writes it, a file may hold it: |q| must not wrap
    blocks = Q8Blocks(codes, blocks.scales)
    run = kernel_form(load_cpu_kernels(), FORMS["int8_q8"], blocks)
    assert run is not None
    x = torch.randn(num_tokens, 256).bfloat16()
    x[0, 40] = 30.0
    out = run(x).double()
    assert out.shape == (num_tokens, 40)
    # What the kernel says it computes: Σ_g d·a·Σ q·x̂, integer sums exact, then float32 and one bfloat16 rounding.
    q, a = q8_rows(x)
    products = torch.einsum("mgk,ngk->mng", q.double(), blocks.codes.double().view(40, -1, 32))
    stated = (products * a.double().unsqueeze(1) * blocks.scales.double()).sum(-1)
    assert ((out - stated).abs() <= 2**-8 * stated.abs() + 1e-4 * stated.abs().max()).all()


def test_q8_blocks_of_a_q8_0_tensor_are_its_own_blocks() -> None:
    generator = torch.Generator().manual_seed(3)
    codes = torch.randint(-127, 128, (16, 64), dtype=torch.int8, generator=generator)
    codes[:, 0] = 127  # llama.cpp's quantizer gives each group's largest ±127
    codes[:, 32] = -127
    scales = (torch.rand(16, 2, generator=generator) * 0.01 + 1e-4).half().float()
    blocks = Q8Blocks(codes, scales)
    again = Q8Blocks.quantize(blocks.dequantize())
    assert torch.equal(again.codes, codes) and torch.equal(again.scales, scales)


@needs_kernels
@pytest.mark.parametrize("has_min", [True, False], ids=["q5_1", "q5_0"])
@pytest.mark.parametrize("num_tokens", [1, 8, 9, 40])
def test_int5_q8_multiplies_5_bit_codes_as_int4_q8_does_4_bit_ones(has_min: bool, num_tokens: int) -> None:
    blocks = random_q5_blocks(40, 256, has_min)  # NOTE: 40 outputs: padded to 48 for the kernel, cut again
    codes = blocks.codes.clone()
    codes[3], codes[4] = 31, torch.arange(256) % 32  # NOTE: all fifth bits set, then every code in turn
    blocks = Q5Blocks(codes, blocks.scales, blocks.mins)
    run = kernel_form(load_cpu_kernels(), FORMS["int5_q8"], blocks)
    assert run is not None
    x = torch.randn(num_tokens, 256).bfloat16()
    x[0, 40] = 30.0
    out = run(x).double()
    # What the kernel says it computes: Σ_g d·a·Σ q·x̂ + m·a·Σ x̂; integer sums exact, then float32 and one
    # bfloat16 rounding.
    q, a = q8_rows(x)
    products = torch.einsum("mgk,ngk->mng", q.double(), codes.double().view(40, -1, 32))
    sums = q.double().sum(-1) * a.double()
    stated = (products * a.double().unsqueeze(1) * blocks.scales.double()).sum(-1) + sums @ blocks.mins.double().T
    assert ((out - stated).abs() <= 2**-8 * stated.abs() + 1e-4 * stated.abs().max()).all()


@needs_kernels
@pytest.mark.parametrize("kind", [Q4KBlocks, Q5KBlocks], ids=["q4_k", "q5_k"])
@pytest.mark.parametrize("num_tokens", [1, 8, 9, 40])
def test_int4k_q8_multiplies_q4_k_blocks_with_their_two_level_scales(kind: type[Q4KBlocks | Q5KBlocks], num_tokens: int) -> None:
    blocks = random_q4k_blocks(40, 512, kind)  # NOTE: 40 outputs: padded to 48 for the kernel, cut again
    run = kernel_form(load_cpu_kernels(), FORMS["int4k_q8" if kind is Q4KBlocks else "int5k_q8"], blocks)
    assert run is not None
    x = torch.randn(num_tokens, 512).bfloat16()
    x[0, 40] = 30.0
    out = run(x).double()
    # What the kernel says it computes: Σ_g (d·s_g)·a·Σ q·x̂ − (dmin·m_g)·a·Σ x̂, the 6-bit scales times the
    # super-block's float16 d exact in float32; then float32 sums and one bfloat16 rounding.
    q, a = q8_rows(x)
    codes = blocks.codes.double().view(40, -1, 32)
    products = torch.einsum("mgk,ngk->mng", q.double(), codes)
    scales = blocks.d.double().repeat_interleave(8, dim=1) * blocks.scales.double()
    mins = blocks.dmin.double().repeat_interleave(8, dim=1) * blocks.mins.double()
    sums = q.double().sum(-1) * a.double()
    stated = (products * a.double().unsqueeze(1) * scales).sum(-1) - sums @ mins.T
    assert ((out - stated).abs() <= 2**-8 * stated.abs() + 1e-4 * stated.abs().max()).all()
    assert_within_half_a_step_of_each_input(out, x, blocks.dequantize(), a)


@needs_kernels
@pytest.mark.parametrize("num_tokens", [1, 8, 9, 40])
def test_int6k_q8_multiplies_q6_k_blocks_with_their_sub_block_scales(num_tokens: int) -> None:
    blocks = random_q6k_blocks(40, 512)  # NOTE: 40 outputs: padded to 48 for the kernel, cut again
    codes = blocks.codes.clone()
    codes[3, :16], codes[4, 16:32] = 0, 63  # NOTE: the codes' ends (q − 32 = −32 and 31) beside a −128 scale
    scales = blocks.scales.clone()
    scales[3, 0], scales[4, 1] = -128, -128
    blocks = Q6KBlocks(codes, scales, blocks.d)
    run = kernel_form(load_cpu_kernels(), FORMS["int6k_q8"], blocks)
    assert run is not None
    x = torch.randn(num_tokens, 512).bfloat16()
    x[0, 40] = 30.0
    out = run(x).double()
    assert out.shape == (num_tokens, 40)
    # What the kernel says it computes: Σ_g a·Σ_j d·s_j·Σ_{k∈j} (q − 32)·x̂, integer sums exact, then
    # float32 and one bfloat16 rounding.
    q, a = q8_rows(x)
    products = torch.einsum("mjk,njk->mnj", q.double().view(num_tokens, -1, 16), codes.double().view(40, -1, 16) - 32)
    steps = blocks.d.double().repeat_interleave(16, dim=1) * blocks.scales.double()
    stated = (products * steps * a.double().repeat_interleave(2, dim=1).unsqueeze(1)).sum(-1)
    assert ((out - stated).abs() <= 2**-8 * stated.abs() + 1e-4 * stated.abs().max()).all()
    # Against the exact product: no further than half a step of each input's group.
    expected = x.double() @ blocks.dequantize().double().T
    weights = blocks.dequantize().double().abs().view(40, -1, 32)
    steps = torch.einsum("mg,ngk->mn", a.double() / 2, weights)
    assert ((out - expected).abs() <= steps + 2**-8 * expected.abs() + 1e-4 * expected.abs().max()).all()


@needs_kernels
@pytest.mark.parametrize("num_tokens", [1, 8, 9, 40])
def test_iq4xs_q8_multiplies_table_values_with_their_group_scales(num_tokens: int) -> None:
    blocks = random_iq4xs_blocks(40, 512)  # NOTE: 40 outputs: padded to 48 for the kernel, cut again
    run = kernel_form(load_cpu_kernels(), FORMS["iq4xs_q8"], blocks)
    assert run is not None
    x = torch.randn(num_tokens, 512).bfloat16()
    x[0, 40] = 30.0
    out = run(x).double()
    # What the kernel says it computes: Σ_g (d·s_g)·a·Σ v·x̂ (v the table's values), integer sums exact,
    # then float32 and one bfloat16 rounding.
    q, a = q8_rows(x)
    values = torch.tensor(IQ4_VALUES, dtype=torch.float64)[blocks.codes.long()].view(40, -1, 32)
    products = torch.einsum("mgk,ngk->mng", q.double(), values)
    steps = blocks.d.double().repeat_interleave(8, dim=1) * blocks.scales.double()
    stated = (products * a.double().unsqueeze(1) * steps).sum(-1)
    assert ((out - stated).abs() <= 2**-8 * stated.abs() + 1e-4 * stated.abs().max()).all()


@needs_kernels
@pytest.mark.parametrize("num_tokens", [1, 8, 9, 40])
def test_mxfp4_q8_multiplies_the_dequantized_weight_by_the_rounded_rows(num_tokens: int) -> None:
    blocks = random_mxfp4_blocks(40, 512)  # NOTE: 40 outputs: padded to 48 for the kernel, cut again
    exponents = blocks.exponents.clone()
    exponents[3] = torch.arange(16) % 4  # NOTE: subnormal steps (2^-128, 2^-127) and the smallest normal ones
    exponents[4, 8] = 252  # NOTE: the largest step whose weights float32 holds (12 · 2^124)
    blocks = MXFP4Blocks(blocks.codes, exponents)
    run = kernel_form(load_cpu_kernels(), FORMS["mxfp4_q8"], blocks)
    assert run is not None
    x = torch.randn(num_tokens, 512).bfloat16()
    x[0, 40] = 30.0
    x[:, 256:288] *= 2.0**-100  # NOTE: the huge group meets tiny inputs: its products stay in range
    out = run(x).double()
    assert out.shape == (num_tokens, 40)
    # What the kernel says it computes: the dequantized weight (values · 2^(E − 128)) times the rounded rows
    # x̂ · a, integer sums exact, then float32 (at most 2^-20 of the terms' magnitudes) and one bfloat16 rounding.
    q, a = q8_rows(x)
    rounded = (q.double() * a.double().unsqueeze(-1)).view(num_tokens, -1)
    weight = blocks.dequantize().double()
    stated, magnitude = rounded @ weight.T, rounded.abs() @ weight.abs().T
    assert stated.isfinite().all() and (stated[:, 4].abs() > 2.0**16).all() and (stated[:, 3].abs() < 1e-30).all()
    assert ((out - stated).abs() <= 2**-8 * stated.abs() + 2**-20 * magnitude).all()


@needs_kernels
def test_mxfp4_q8_refuses_exponents_whose_weights_pass_float32() -> None:
    blocks = random_mxfp4_blocks(16, 64)
    exponents = blocks.exponents.clone()
    exponents[7, 1] = 253  # NOTE: 12 · 2^125 is past float32's largest (e8m0's 255 is not a number)
    with pytest.raises(RuntimeError, match="exponent is 253: above 252"):
        kernel_form(load_cpu_kernels(), FORMS["mxfp4_q8"], MXFP4Blocks(blocks.codes, exponents))


@needs_kernels
def test_parts_of_different_kinds_each_run_on_their_own_form() -> None:
    parts = [random_q4k_blocks(32, 256), random_q6k_blocks(16, 256), random_q4k_blocks(48, 256)]
    kernels = load_cpu_kernels()
    bias = torch.randn(96).bfloat16()
    run = parts_form(kernels, parts, bias)
    assert run is not None
    x = torch.randn(5, 256).bfloat16()
    out = run(x)
    assert out.shape == (5, 96)
    forms = [FORMS["int4k_q8"], FORMS["int6k_q8"], FORMS["int4k_q8"]]
    alone = [kernel_form(kernels, spec, part) for spec, part in zip(forms, parts, strict=True)]
    assert all(part_run is not None for part_run in alone)
    assert torch.equal(out, torch.cat([part_run(x) for part_run in alone if part_run is not None], dim=-1) + bias)


def test_shards_of_different_kinds_are_stacked_as_8_bit_blocks() -> None:
    # NOTE: a Q4_K_M file holds a layer's queries in Q4_K and its values in Q6_K (read as Q8_0).
    q4k, q8 = random_q4k_blocks(32, 256), Q8Blocks.quantize(random_q8_weight(16, 256))
    fused = cat_blocks([q4k, q8])
    assert isinstance(fused, Q8Blocks) and fused.codes.shape == (48, 256)
    expected = torch.cat([q4k.dequantize(), q8.dequantize()])
    # NOTE: the Q4_K rows rounded again to 8 bits: at most half a step of 1/127 of each group's largest.
    assert ((fused.dequantize() - expected).abs() <= expected.abs().amax() / 254 + 1e-9).all()
    assert isinstance(cat_blocks([q4k, q4k]), Q4KBlocks)
    q6k = random_q6k_blocks(16, 256)
    assert isinstance(cat_blocks([q6k, q6k]), Q6KBlocks) and isinstance(cat_blocks([q4k, q6k]), Q8Blocks)
