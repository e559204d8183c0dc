"""The model's linear layers, and the GGUF's 4-bit group-32 blocks they can run on.

A Q4_1 block holds 32 codes q in 0..15, a scale d and a minimum m: w = q·d + m. The CPU int4
kernel computes w = (q − 8)·scale + zero per group of 32, so scale = d and zero = m + 8·d map
the file's blocks onto it without re-quantizing (Q4_0 is the case m = −8·d). Scales and zeros
are rounded to the activations' dtype (bfloat16), so results match the dequantized weights
within a tolerance, not bit for bit.
"""

from __future__ import annotations

import sys
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine_proc.models.matmul_forms import FORMS, MatmulForms

GROUP_SIZE = 32
# NOTE: all 120 projections of SmolLM2-135M, weights streamed from memory as in a step, 2
# threads. Intel with AMX: int4 6.0 / 8.0 / 15.4 / 19.8 ms at 1 / 2 / 4 / 6 tokens against
# 18-22 ms for prepacked bfloat16 at any of them; Zen 4: int4 ahead up to 8 tokens (24 vs
# 25 ms). Four keeps int4 where it wins on both.
INT4_MAX_TOKENS = 4
# The forms of the 4-bit blocks that zeroserve's CPU kernels multiply (see matmul_forms): each
# has `pack_<form>` and `<form>` in the kernels' module.
KERNEL_FORMS = ("int4_dot", "int4_q8")


class Q4Blocks(NamedTuple):
    """A weight [rows, cols] as 4-bit codes with a scale and a minimum per group of 32 columns."""

    codes: Tensor  # [rows, cols] uint8, values 0..15
    scales: Tensor  # [rows, cols // 32] float32
    mins: Tensor  # [rows, cols // 32] float32

    def dequantize(self) -> Tensor:
        rows, cols = self.codes.shape
        groups = self.codes.view(rows, cols // GROUP_SIZE, GROUP_SIZE).float()
        return (groups * self.scales.unsqueeze(-1) + self.mins.unsqueeze(-1)).view(rows, cols)

    @staticmethod
    def cat(parts: list[Q4Blocks]) -> Q4Blocks:
        """The blocks of the weights stacked by rows (a fused projection from its shards)."""
        return Q4Blocks(*(torch.cat(tensors) for tensors in zip(*parts, strict=True)))


class Q8Blocks(NamedTuple):
    """A weight [rows, cols] as 8-bit codes with a scale per group of 32 columns (GGUF's Q8_0): w = q·d."""

    codes: Tensor  # [rows, cols] int8, values -127..127
    scales: Tensor  # [rows, cols // 32] float32, values a float16 holds

    def dequantize(self) -> Tensor:
        rows, cols = self.codes.shape
        groups = self.codes.view(rows, cols // GROUP_SIZE, GROUP_SIZE).float()
        return (groups * self.scales.unsqueeze(-1)).view(rows, cols)

    @staticmethod
    def quantize(weight: Tensor) -> Q8Blocks:
        """A float weight rounded as llama.cpp's quantize_row_q8_0 rounds it: d = max|w| / 127 per group
        (kept as float16), q = round(w / d). A Q8_0 tensor's own values come back as its own blocks."""
        rows, cols = weight.shape
        groups = weight.float().view(rows, cols // GROUP_SIZE, GROUP_SIZE)
        scales = groups.abs().amax(dim=-1) / 127
        inverse = torch.where(scales > 0, 1 / scales, torch.zeros_like(scales))
        codes = (groups * inverse.unsqueeze(-1)).round_().clamp_(-127, 127).to(torch.int8).view(rows, cols)
        return Q8Blocks(codes, scales.half().float())


def add_int8_q8(matmul: MatmulForms, kernels: Any, blocks: Q8Blocks) -> None:
    """Gives `matmul` the int8_q8 form of its weight's 8-bit blocks (outputs padded to a multiple of 16
    for the kernel, the padding's columns cut from each result)."""
    num_rows = blocks.codes.shape[0]
    padding = -num_rows % 16
    codes, scales = blocks
    if padding:
        codes = F.pad(codes, (0, 0, 0, padding))
        scales = F.pad(scales, (0, 0, 0, padding))
    packed = kernels.pack_int8_q8(codes, scales)
    run, bias = kernels.int8_q8, matmul.bias

    def int8_q8(x: Tensor) -> Tensor:
        out = run(x.contiguous(), *packed)
        out = out[:, :num_rows] if padding else out
        return out if bias is None else out + bias

    matmul.add("int8_q8", int8_q8)


def is_int4_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """The CPU int4 kernel is fast with 16-bit activations only (its float32 path is a slow reference)."""
    return device.type == "cpu" and dtype == torch.bfloat16


class Linear(nn.Linear):
    """A linear layer that runs each batch in the fastest form kept for its weight (see matmul_forms)."""

    int4_weight: Tensor | None
    int4_scales_and_zeros: Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("int4_weight", None, persistent=False)
        self.register_buffer("int4_scales_and_zeros", None, persistent=False)
        # NOTE: not buffers: oneDNN's layout cannot move devices; `unpack()` drops them.
        self.forms: MatmulForms | None = None
        # NOTE: the 4-bit blocks as loaded, kept from `set_int4` until the first `prepack` gives them
        # the CPU kernels' layouts (`kernels`: see LlamaForCausalLM.prepack), kept until `unpack`.
        self.int4_blocks: Q4Blocks | None = None
        self.kernel_weights: dict[str, tuple[Tensor, Tensor, Tensor]] = {}
        self.kernels: Any | None = None

    def prepack(self, forms: tuple[str, ...] = ("packed",), is_invariant: bool = False) -> MatmulForms:
        """Builds the named forms where they run here (int4 whenever loaded; the KERNEL_FORMS and int8
        only beside int4; float32 only where bfloat16 cannot be packed), with the plan int4 up to
        INT4_MAX_TOKENS, then packed where there, else dense (`measure_plan` may replace it). With
        `is_invariant`, a weight that has a row-invariant form gets only those (the plan runs one)."""
        matmul = MatmulForms(self.weight, self.bias)
        if self.int4_weight is not None:
            matmul.add("int4", self._int4)
        for form in KERNEL_FORMS:
            if form in forms:
                self._add_kernel_form(matmul, form)
        self.int4_blocks = None
        self.forms = matmul
        if is_invariant and any(FORMS[form].is_row_invariant for form in matmul.runs):
            matmul.plan = ((sys.maxsize, next(form for form in matmul.runs if FORMS[form].is_row_invariant)),)
            return matmul
        is_packed = "packed" in forms and matmul.add_packed()
        if "int8" in forms and self.int4_weight is not None:
            matmul.add_int8()
        if "float32" in forms and not is_packed and self.weight.dtype != torch.float32:
            matmul.add_float32()
        large = "packed" if is_packed else "dense"
        matmul.plan = ((INT4_MAX_TOKENS, "int4"), (sys.maxsize, large)) if "int4" in matmul.runs else ((sys.maxsize, large),)
        return matmul

    def drop_unplanned(self) -> None:
        """Frees the kernels' packings that this weight's plan does not use (after a measured plan:
        the default model keeps one 4-bit packing of 63 MiB instead of two)."""
        if self.forms is not None:
            self.kernel_weights = {form: packed for form, packed in self.kernel_weights.items() if form in self.forms.runs}

    def unpack(self) -> None:
        self.forms = None
        self.kernel_weights = {}

    def _add_kernel_form(self, matmul: MatmulForms, form: str) -> None:
        """A form of the 4-bit blocks multiplied by the CPU kernels (`KERNEL_FORMS`), where they run
        and take this weight (rows a multiple of 16; scales and minimums that a float16 holds, as a
        GGUF's are)."""
        kernels, blocks = self.kernels, self.int4_blocks
        if form not in self.kernel_weights and blocks is not None and kernels is not None and not self.out_features % 16:
            if all(torch.equal(t.half().float(), t) for t in (blocks.scales, blocks.mins)):
                self.kernel_weights[form] = getattr(kernels, f"pack_{form}")(blocks.codes, blocks.scales, blocks.mins)
        if form not in self.kernel_weights or kernels is None:
            return
        codes, scales, mins = self.kernel_weights[form]
        run = getattr(kernels, form)
        bias = self.bias
        if bias is None:
            matmul.add(form, lambda x: run(x.contiguous(), codes, scales, mins))
        else:
            matmul.add(form, lambda x: run(x.contiguous(), codes, scales, mins) + bias)

    def set_int4(self, blocks: Q4Blocks, dtype: torch.dtype) -> None:
        """Packs the blocks (the same weight as `self.weight`) for the int4 kernel."""
        if blocks.codes.shape != self.weight.shape or self.in_features % GROUP_SIZE:
            raise ValueError(f"int4 blocks of shape {tuple(blocks.codes.shape)} for a {tuple(self.weight.shape)} weight")
        device = self.weight.device
        self.int4_blocks = blocks
        self.int4_weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            blocks.codes.to(device=device, dtype=torch.int32), 1
        )
        zeros = blocks.mins + 8 * blocks.scales
        # NOTE: the kernel wants [cols // 32, rows, 2] pairs of (scale, zero).
        self.int4_scales_and_zeros = (
            torch.stack((blocks.scales, zeros), dim=-1).transpose(0, 1).contiguous().to(device=device, dtype=dtype)
        )

    def _int4(self, x: Tensor) -> Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.int4_weight, GROUP_SIZE, self.int4_scales_and_zeros)
        return out if self.bias is None else out + self.bias

    def forward(self, x: Tensor) -> Tensor:
        if self.forms is not None:
            return self.forms(x)
        if self.int4_weight is not None and x.shape[0] <= INT4_MAX_TOKENS:
            return self._int4(x)
        return F.linear(x, self.weight, self.bias)
