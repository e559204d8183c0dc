"""Every form a matmul's weight can run in, one entry each: what it is made from, what it promises
(row invariance, a fidelity bound), for torch's forms how they are made and which weights get them,
and for the forms of zeroserve's C++ kernels how they pack a weight's blocks, multiply by them, and
are tried at load.

A new kernel form is one entry here, its kernel in engine_proc/cpu/csrc/ and its test cases; the plan
(matmul_forms, matmul_plan), the layers (quantized_linear), the trial calls at load (cpu_kernels),
the log, /version and the tests read this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from engine_proc.cpu.torch_forms import (
    Int8Rows,
    Made,
    TorchFormContext,
    make_float32,
    make_int8,
    make_packed,
    make_transposed,
)
from engine_proc.cpu.weight_blocks import (
    Blocks,
    BlocksKind,
    IQ4XSBlocks,
    MXFP4Blocks,
    Q4Blocks,
    Q4KBlocks,
    Q5Blocks,
    Q5KBlocks,
    Q6KBlocks,
    Q8Blocks,
)


@dataclass(frozen=True)
class Fidelity:
    """How far a form may move the default model's greedy picks from transformers' float32
    (tests/engine_proc/test_fidelity_int4.py): fed the reference's own tokens, the reference's
    token is our top pick at >= 90% of positions, never below our rank `max_rank`, and not our top
    pick only where the reference's own top two lie within `near_tie_nats`."""

    max_rank: int = 3
    near_tie_nats: float = 0.25


# NOTE: rounding the activations to 8 bits (as llama.cpp multiplies these files) moves more near
# ties: int4_q8 at one position ranked the reference's token sixth where the reference's top six lay
# within 0.4 nats; int4k_q8 (tests/engine_proc/test_fidelity_k_quants.py) missed where the reference
# led by 0.501. The kernels' AVX-512 and AVX2 bodies give the same bits, so what one x86 CPU measures
# every one does: the bound is the widest miss measured with room to spare.
ROUNDED_ACTIVATIONS = Fidelity(max_rank=8, near_tie_nats=0.6)


@dataclass(frozen=True)
class KernelOps:
    """How zeroserve's C++ kernels (the module `load_cpu_kernels` returns) pack a weight's blocks
    for a form and multiply bfloat16 rows by them, and a trial call that must hold before a load uses them."""

    blocks: BlocksKind
    pack: Callable[[Any, Blocks], list[Tensor]]
    run: Callable[[Any], Callable[..., Tensor]]
    trial: Callable[[Any], bool]


@dataclass(frozen=True)
class TorchOps:
    """How one of torch's forms is made from a weight's loaded values, and which weights get it."""

    make: Callable[[Tensor, Tensor | None, Int8Rows | None], Made | None]
    is_given: Callable[[TorchFormContext], bool]


@dataclass(frozen=True)
class FormSpec:
    """One matmul form: what it is built from, its promises, and how it is made: torch's (`torch_ops`) or
    zeroserve's C++ kernel (`kernel`)."""

    name: str
    source: str  # "weight": the loaded float weight; "q4 blocks", "q5k blocks", ...: the file's blocks (weight_blocks)
    is_row_invariant: bool  # each row's bits are the same whatever other rows share the call
    fidelity: Fidelity
    kernel: KernelOps | None = None  # zeroserve's C++ kernel forms only
    torch_ops: TorchOps | None = None  # torch's forms, made from the loaded values


def _trial_q4(kernels: Any) -> bool:
    """int4_q8 on 16 outputs × 64 inputs, 3 rows, against the dequantized weight's product."""
    codes = (torch.arange(16 * 64) % 16).to(torch.uint8).view(16, 64)
    blocks = Q4Blocks(codes, torch.full((16, 2), 0.25), torch.full((16, 2), -1.0))
    return _is_close(kernels, FORMS["int4_q8"], blocks)


def _trial_q8(kernels: Any) -> bool:
    """int8_q8 on 16 outputs × 64 inputs of both signs, 3 rows, against the dequantized weight's product."""
    codes = ((torch.arange(16 * 64) * 37) % 255 - 127).to(torch.int8).view(16, 64)
    return _is_close(kernels, FORMS["int8_q8"], Q8Blocks(codes, torch.full((16, 2), 0.125)))


def _trial_q4k(kernels: Any) -> bool:
    """int4k_q8 on 16 outputs × one super-block of 256 inputs, 3 rows, against the dequantized weight's product."""
    codes = (torch.arange(16 * 256) % 16).to(torch.uint8).view(16, 256)
    scales = (torch.arange(16 * 8) % 64).to(torch.uint8).view(16, 8)
    mins = (torch.arange(16 * 8) * 7 % 64).to(torch.uint8).view(16, 8)
    blocks = Q4KBlocks(codes, scales, mins, torch.full((16, 1), 2.0**-6), torch.full((16, 1), 2.0**-7))
    return _is_close(kernels, FORMS["int4k_q8"], blocks)


def _trial_q5(kernels: Any) -> bool:
    """int5_q8 on 16 outputs × 64 inputs, every code 0..31, 3 rows, against the dequantized weight's product."""
    codes = (torch.arange(16 * 64) * 3 % 32).to(torch.uint8).view(16, 64)
    blocks = Q5Blocks(codes, torch.full((16, 2), 0.125), torch.full((16, 2), -2.0))
    return _is_close(kernels, FORMS["int5_q8"], blocks)


def _trial_q5k(kernels: Any) -> bool:
    """int5k_q8 on 16 outputs × one super-block of 256 inputs, 3 rows, against the dequantized weight's product."""
    codes = (torch.arange(16 * 256) * 3 % 32).to(torch.uint8).view(16, 256)
    scales = (torch.arange(16 * 8) % 64).to(torch.uint8).view(16, 8)
    mins = (torch.arange(16 * 8) * 7 % 64).to(torch.uint8).view(16, 8)
    blocks = Q5KBlocks(codes, scales, mins, torch.full((16, 1), 2.0**-7), torch.full((16, 1), 2.0**-7))
    return _is_close(kernels, FORMS["int5k_q8"], blocks)


def _trial_q6k(kernels: Any) -> bool:
    """int6k_q8 on 16 outputs × one super-block of 256 inputs, 3 rows, against the dequantized weight's product."""
    codes = (torch.arange(16 * 256) * 5 % 64).to(torch.uint8).view(16, 256)
    scales = (torch.arange(16 * 16) * 13 % 255 - 127).to(torch.int8).view(16, 16)
    return _is_close(kernels, FORMS["int6k_q8"], Q6KBlocks(codes, scales, torch.full((16, 1), 2.0**-10)))


def _trial_iq4xs(kernels: Any) -> bool:
    """iq4xs_q8 on 16 outputs × one super-block of 256 inputs, every index, 3 rows, against the dequantized weight's product."""
    codes = (torch.arange(16 * 256) * 7 % 16).to(torch.uint8).view(16, 256)
    scales = (torch.arange(16 * 8) * 5 % 64 - 32).to(torch.int8).view(16, 8)
    return _is_close(kernels, FORMS["iq4xs_q8"], IQ4XSBlocks(codes, scales, torch.full((16, 1), 2.0**-10)))


def _trial_mxfp4(kernels: Any) -> bool:
    """mxfp4_q8 on 16 outputs × 64 inputs, every code, steps 2^−4 .. 2^3, 3 rows, against the dequantized weight's product."""
    # NOTE: the positive codes twice as often as the negative ones: MXFP4's values are symmetric, and a
    # weight whose every sign comes as often would cancel to sums that the 8-bit inputs move by more.
    codes = (torch.arange(16 * 64) * 7 % 24 % 16).to(torch.uint8).view(16, 64)
    exponents = (124 + torch.arange(16 * 2) % 8).to(torch.uint8).view(16, 2)
    return _is_close(kernels, FORMS["mxfp4_q8"], MXFP4Blocks(codes, exponents))


def _is_close(kernels: Any, spec: FormSpec, blocks: Blocks) -> bool:
    assert spec.kernel is not None
    num_inputs = blocks.codes.shape[1]
    x = torch.linspace(-1, 1, 3 * num_inputs).view(3, num_inputs).bfloat16()
    got = spec.kernel.run(kernels)(x, *spec.kernel.pack(kernels, blocks)).float()
    expected = x.float() @ blocks.dequantize().t()
    # NOTE: bfloat16 rounds the outputs (2**-8); the 8-bit inputs move each product by at most half a
    # step, 1/254 of its group's largest input.
    return bool((got - expected).abs().max() <= 0.02 * expected.abs().max())


FORMS = {spec.name: spec for spec in (
    FormSpec("dense", "weight", is_row_invariant=False, fidelity=Fidelity()),
    # oneDNN's blocked bfloat16 layout, where it packs (native bfloat16).
    FormSpec(
        "packed", "weight", is_row_invariant=False, fidelity=Fidelity(),
        torch_ops=TorchOps(make_packed, lambda c: "packed" in c.asked),
    ),
    # A float32 copy where bfloat16 cannot be packed (emulated on AVX2).
    FormSpec(
        "float32", "weight", is_row_invariant=False, fidelity=Fidelity(),
        torch_ops=TorchOps(make_float32, lambda c: "float32" in c.asked and "packed" not in c.made and c.dtype.itemsize < 4),
    ),
    # [in, out] for `x @ w`: an output head beside its packed form (a narrow head ran faster so at many rows).
    FormSpec(
        "transposed", "weight", is_row_invariant=False, fidelity=Fidelity(),
        torch_ops=TorchOps(make_transposed, lambda c: c.role == "head" and "packed" in c.made),
    ),
    # int8 rows: a projection's beside its 4-bit blocks on torch's int4 kernel (the rounding of an 8-bit row
    # is far below the file's 4-bit one), a head's given from its float32 values.
    FormSpec(
        "int8", "weight", is_row_invariant=False, fidelity=Fidelity(),
        torch_ops=TorchOps(make_int8, lambda c: "int8" in c.asked and (c.has_int8_rows if c.role == "head" else c.has_int4)),
    ),
    FormSpec("int4", "q4 blocks", is_row_invariant=False, fidelity=Fidelity()),
    # A fused projection whose parts came in different types (a Q4_K_M file's Q4_K queries and keys
    # beside Q6_K values): each run of parts of one type on the kernel form that takes them, their
    # outputs side by side (quantized_linear.parts_form): row-invariant as those forms are.
    FormSpec("parts", "blocks of several kinds", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS),
    FormSpec(
        "int4_q8", "q4 blocks", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS,
        kernel=KernelOps(
            Q4Blocks, lambda kernels, b: kernels.pack_int4_q8(*b), lambda kernels: kernels.int4_q8, _trial_q4,
        ),
    ),
    FormSpec(
        "int4k_q8", "q4k blocks", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS,
        kernel=KernelOps(
            Q4KBlocks, lambda kernels, b: kernels.pack_int4k_q8(*b), lambda kernels: kernels.int4k_q8, _trial_q4k,
        ),
    ),
    FormSpec(
        "int5_q8", "q5 blocks", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS,
        kernel=KernelOps(
            Q5Blocks, lambda kernels, b: kernels.pack_int5_q8(*b), lambda kernels: kernels.int5_q8, _trial_q5,
        ),
    ),
    FormSpec(
        "int5k_q8", "q5k blocks", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS,
        kernel=KernelOps(
            Q5KBlocks, lambda kernels, b: kernels.pack_int5k_q8(*b), lambda kernels: kernels.int5k_q8, _trial_q5k,
        ),
    ),
    FormSpec(
        "int6k_q8", "q6k blocks", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS,
        kernel=KernelOps(
            Q6KBlocks, lambda kernels, b: kernels.pack_int6k_q8(*b), lambda kernels: kernels.int6k_q8, _trial_q6k,
        ),
    ),
    FormSpec(
        "iq4xs_q8", "iq4xs blocks", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS,
        kernel=KernelOps(
            IQ4XSBlocks, lambda kernels, b: kernels.pack_iq4xs_q8(*b), lambda kernels: kernels.iq4xs_q8, _trial_iq4xs,
        ),
    ),
    FormSpec(
        "mxfp4_q8", "mxfp4 blocks", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS,
        kernel=KernelOps(
            MXFP4Blocks, lambda kernels, b: kernels.pack_mxfp4_q8(*b), lambda kernels: kernels.mxfp4_q8, _trial_mxfp4,
        ),
    ),
    FormSpec(
        "int8_q8", "q8 blocks", is_row_invariant=True, fidelity=ROUNDED_ACTIVATIONS,
        kernel=KernelOps(
            Q8Blocks, lambda kernels, b: kernels.pack_int8_q8(*b), lambda kernels: kernels.int8_q8, _trial_q8,
        ),
    ),
)}
# The forms zeroserve's C++ kernels run, in the order a weight is given them.
KERNEL_FORMS = tuple(spec for spec in FORMS.values() if spec.kernel is not None)
# The kernel forms that C++ layers (moe_experts, decoder_layers) call by number: csrc/kernel_forms.h's `run_form`
# numbers them in this order.
FUSED_FORMS = ("int4_q8", "int4k_q8", "int5_q8", "int5k_q8", "int6k_q8", "int8_q8", "iq4xs_q8", "mxfp4_q8")
# torch's forms of the loaded values, in the order a weight is given them (a rule may read the ones before).
TORCH_FORMS = tuple(spec for spec in FORMS.values() if spec.torch_ops is not None)


def is_plan_row_invariant(plan: tuple[tuple[int, str], ...]) -> bool:
    """Whether a plan runs one row-invariant form at every batch size."""
    return len(plan) == 1 and FORMS[plan[0][1]].is_row_invariant
