"""A weight as a GGUF file holds it: blocks of 32 inputs, each with its own scale (and minimum).

A Q4_1 block holds 32 codes q in 0..15, a scale d and a minimum m: w = q·d + m (Q4_0 is the case
m = −8·d). A Q8_0 block holds 32 codes q in −127..127 and a scale d: w = q·d. The scales (and
minimums) are float16 in the file, so every value here is one a float16 holds. A Q4_K super-block
of 256 holds eight such groups of 4-bit codes whose scales and minimums are 6-bit integers times the
super-block's float16 d and dmin. Q5_0, Q5_1 and Q5_K are their 4-bit kin with 5-bit codes. A Q6_K super-block of 256 holds 6-bit codes in sixteen sub-blocks
of 16, each with a signed 8-bit scale times the super-block's float16 d. An IQ4_XS super-block of 256
holds 4-bit indices into a table of 16 values, in groups of 32 with a signed 6-bit scale each. An
MXFP4 block of 32 (gpt-oss's experts) holds 4-bit floats (e2m1) and a power-of-two scale, an 8-bit exponent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

GROUP_SIZE = 32


def _affine(codes: Tensor, scales: Tensor, mins: Tensor) -> Tensor:
    """codes [rows, cols] · scales + mins, both [rows, cols // 32]: one per group of 32."""
    rows, cols = codes.shape
    groups = codes.view(rows, cols // GROUP_SIZE, GROUP_SIZE).float()
    return (groups * scales.unsqueeze(-1) + mins.unsqueeze(-1)).view(rows, cols)


class Q4Blocks(NamedTuple):
    """A weight [rows, cols] as 4-bit codes with a scale and a minimum per group of 32 columns."""

    codes: Tensor  # [rows, cols] uint8, values 0..15
    scales: Tensor  # [rows, cols // 32] float32
    mins: Tensor  # [rows, cols // 32] float32

    def dequantize(self) -> Tensor:
        return _affine(self.codes, self.scales, self.mins)

    @staticmethod
    def quantize(weight: Tensor) -> Q4Blocks:
        """A float weight rounded as llama.cpp's quantize_row_q4_0 rounds it: d = (the group's value of largest
        magnitude) / −8, kept as float16; q = clamp(trunc(w / d + 8.5), 0, 15); w ≈ (q − 8)·d."""
        rows, cols = weight.shape
        groups = weight.float().view(rows, cols // GROUP_SIZE, GROUP_SIZE)
        extreme = groups.gather(-1, groups.abs().argmax(dim=-1, keepdim=True)).squeeze(-1)
        scales = (extreme / -8).half().float()
        inverse = torch.where(scales != 0, 1 / (extreme / -8), torch.zeros_like(scales))
        codes = (groups * inverse.unsqueeze(-1) + 8.5).trunc_().clamp_(0, 15).to(torch.uint8).view(rows, cols)
        return Q4Blocks(codes, scales, -8 * scales)


class Q5Blocks(NamedTuple):
    """A weight [rows, cols] as 5-bit codes with a scale and a minimum per group of 32 columns (GGUF's
    Q5_1; Q5_0 is the case m = −16·d)."""

    codes: Tensor  # [rows, cols] uint8, values 0..31
    scales: Tensor  # [rows, cols // 32] float32
    mins: Tensor  # [rows, cols // 32] float32

    def dequantize(self) -> Tensor:
        return _affine(self.codes, self.scales, self.mins)



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



class Q4KBlocks(NamedTuple):
    """A weight [rows, cols] as GGUF's Q4_K holds it: 4-bit codes in groups of 32, each group with a 6-bit
    scale and a 6-bit minimum, and per super-block of 256 (8 groups) a float16 d and dmin:
    w = d·sc·q − dmin·m."""

    codes: Tensor  # [rows, cols] uint8, values 0..15
    scales: Tensor  # [rows, cols // 32] uint8, values 0..63
    mins: Tensor  # [rows, cols // 32] uint8, values 0..63
    d: Tensor  # [rows, cols // 256] float32, values a float16 holds
    dmin: Tensor  # [rows, cols // 256] float32, values a float16 holds

    def dequantize(self) -> Tensor:
        return _affine(self.codes, *_super_block_scales(self.scales, self.mins, self.d, self.dmin))


class Q5KBlocks(NamedTuple):
    """A weight [rows, cols] as GGUF's Q5_K holds it: Q4_K's scales with 5-bit codes, w = d·sc·q − dmin·m."""

    codes: Tensor  # [rows, cols] uint8, values 0..31
    scales: Tensor  # [rows, cols // 32] uint8, values 0..63
    mins: Tensor  # [rows, cols // 32] uint8, values 0..63
    d: Tensor  # [rows, cols // 256] float32, values a float16 holds
    dmin: Tensor  # [rows, cols // 256] float32, values a float16 holds

    def dequantize(self) -> Tensor:
        return _affine(self.codes, *_super_block_scales(self.scales, self.mins, self.d, self.dmin))


def _super_block_scales(scales: Tensor, mins: Tensor, d: Tensor, dmin: Tensor) -> tuple[Tensor, Tensor]:
    """A k-quant's per-group scale d·sc and minimum −dmin·m, [rows, cols // 32] float32."""
    per_group = SUPER_BLOCK // GROUP_SIZE
    return d.repeat_interleave(per_group, dim=1) * scales.float(), -dmin.repeat_interleave(per_group, dim=1) * mins.float()



class Q6KBlocks(NamedTuple):
    """A weight [rows, cols] as GGUF's Q6_K holds it: 6-bit codes q in 0..63 in sub-blocks of 16 columns,
    each with a signed 8-bit scale s, and per super-block of 256 a float16 d: w = d·s·(q − 32)."""

    codes: Tensor  # [rows, cols] uint8, values 0..63
    scales: Tensor  # [rows, cols // 16] int8
    d: Tensor  # [rows, cols // 256] float32, values a float16 holds

    def dequantize(self) -> Tensor:
        rows, cols = self.codes.shape
        sub_blocks = self.codes.view(rows, cols // SUB_BLOCK, SUB_BLOCK).float() - 32
        scales = self.d.repeat_interleave(SUPER_BLOCK // SUB_BLOCK, dim=1) * self.scales.float()
        return (sub_blocks * scales.unsqueeze(-1)).view(rows, cols)



# llama.cpp's kvalues_iq4nl: the values an IQ4_NL or IQ4_XS index stands for.
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


class IQ4XSBlocks(NamedTuple):
    """A weight [rows, cols] as GGUF's IQ4_XS holds it: 4-bit indices into IQ4_VALUES in groups of 32, each
    group with a signed 6-bit scale s, and per super-block of 256 a float16 d: w = d·s·IQ4_VALUES[i]."""

    codes: Tensor  # [rows, cols] uint8, values 0..15
    scales: Tensor  # [rows, cols // 32] int8, values -32..31
    d: Tensor  # [rows, cols // 256] float32, values a float16 holds

    def dequantize(self) -> Tensor:
        values = torch.tensor(IQ4_VALUES, dtype=torch.float32)[self.codes.long()]
        steps = self.d.repeat_interleave(SUPER_BLOCK // GROUP_SIZE, dim=1) * self.scales.float()
        return _affine(values, steps, torch.zeros_like(steps))


# ggml's kvalues_mxfp4: the values an MXFP4 code stands for, e2m1's doubled (so that 2^(E − 128) scales them).
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


class MXFP4Blocks(NamedTuple):
    """A weight [rows, cols] as GGUF's MXFP4 holds it: 4-bit codes standing for MXFP4_VALUES in groups of 32,
    each group with an 8-bit exponent E (e8m0): w = MXFP4_VALUES[q]·2^(E − 128)."""

    codes: Tensor  # [rows, cols] uint8, values 0..15
    exponents: Tensor  # [rows, cols // 32] uint8

    @staticmethod
    def from_pairs(packed: Tensor, exponents: Tensor) -> MXFP4Blocks:
        """A weight as a Hugging Face folder holds MXFP4 (gpt-oss's experts): packed [rows, cols // 32, 16] bytes of
        two codes each (element 2j in byte j's low nibble, 2j + 1 in its high one), exponents [rows, cols // 32]
        (the same e8m0 as GGUF's, read there as 2^(E − 127) times e2m1's values)."""
        codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)
        return MXFP4Blocks(codes, exponents.contiguous())

    def dequantize(self) -> Tensor:
        rows, cols = self.codes.shape
        values = torch.tensor(MXFP4_VALUES, dtype=torch.float32)[self.codes.long()]
        return (values.view(rows, cols // GROUP_SIZE, GROUP_SIZE) * mxfp4_steps(self.exponents).unsqueeze(-1)).view(rows, cols)


def mxfp4_steps(exponents: Tensor) -> Tensor:
    """2^(E − 128) per exponent E as float32 from its bits (E 0 and 1: subnormal), as ggml's
    ggml_e8m0_to_fp32_half computes it."""
    e = exponents.int()
    bits = torch.where(e < 2, torch.full_like(e, 0x00200000).bitwise_left_shift(e), (e - 1).bitwise_left_shift(23))
    return bits.view(torch.float32)


SUPER_BLOCK = 256
SUB_BLOCK = 16
Blocks = Q4Blocks | Q5Blocks | Q8Blocks | Q4KBlocks | Q5KBlocks | Q6KBlocks | IQ4XSBlocks | MXFP4Blocks
BlocksKind = (
    type[Q4Blocks] | type[Q5Blocks] | type[Q8Blocks] | type[Q4KBlocks] | type[Q5KBlocks] | type[Q6KBlocks] | type[IQ4XSBlocks]
    | type[MXFP4Blocks]
)


def cat_blocks(parts: list[Blocks]) -> Blocks:
    """The shards' blocks stacked by rows (a fused projection from its shards); shards of different kinds
    (a Q4_K_M file's Q4_K queries beside its Q6_K values) all as Q8_0 blocks, 8 bits a weight being
    finer than any of theirs."""
    if len({type(part) for part in parts}) > 1:
        parts = [part if isinstance(part, Q8Blocks) else Q8Blocks.quantize(part.dequantize()) for part in parts]
    return type(parts[0])(*(torch.cat(tensors) for tensors in zip(*parts, strict=True)))


@dataclass(frozen=True)
class BlocksReader:
    """A weight's blocks read some rows at a time (from its file), so that packing a large one (an
    output head) never holds a whole unpacked copy of it."""

    kind: BlocksKind
    num_rows: int
    read: Callable[[slice], Blocks]

    @staticmethod
    def of(blocks: Blocks) -> BlocksReader:
        """Blocks already in memory, read by slicing."""
        return BlocksReader(type(blocks), blocks.codes.shape[0], lambda rows: type(blocks)(*(t[rows] for t in blocks)))
