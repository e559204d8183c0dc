"""Weight-only quantized matmuls for small batches: 4-bit group-32 projections, an 8-bit output head.

A Q4_1 block holds 32 codes q in 0..15, a scale d and a minimum m: w = q·d + m. The CPU int4
kernel computes w = (q − 8)·scale + zero per group of 32, so scale = d and zero = m + 8·d map
the file's blocks onto it without re-quantizing (Q4_0 is the case m = −8·d). Scales and zeros
are rounded to the activations' dtype (bfloat16), so results match the dequantized weights
within a tolerance, not bit for bit.

The output head (49152 × 576 for SmolLM2) is the largest single matmul of a decode step; with
int8 rows and one scale per row it reads half the bytes of bfloat16.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

GROUP_SIZE = 32
# NOTE: all 120 projections of SmolLM2-135M, weights streamed from memory as in a step, 2
# threads. Intel with AMX: int4 6.0 / 8.0 / 15.4 / 19.8 ms at 1 / 2 / 4 / 6 tokens against
# 18-22 ms for prepacked bfloat16 at any of them; Zen 4: int4 ahead up to 8 tokens (24 vs
# 25 ms). Four keeps int4 where it wins on both.
INT4_MAX_TOKENS = 4
# NOTE: on Zen 4 the int8 kernel is 2.8x faster than bfloat16 for one row, slower from about 8
# rows; with AMX the prepacked bfloat16 head is as fast for one row and faster from two, so the
# int8 head is kept only where it measures faster at this many rows.
INT8_MAX_ROWS = 4


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


def is_int4_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """The CPU int4 kernel is fast with 16-bit activations only (its float32 path is a slow reference)."""
    return device.type == "cpu" and dtype == torch.bfloat16


def is_prepack_supported(weight: Tensor) -> bool:
    """oneDNN keeps bfloat16 CPU weights in its own blocked layout (results unchanged, bit for bit)."""
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


class PackedWeight:
    """A dense weight [out, in] reordered once for oneDNN, so no matmul reorders it again.

    `F.linear` on the CPU re-lays out a bfloat16 weight on every call; measured on the
    default model's 120 projections (2 threads): 11.7 → 7.2 ms at 16 tokens, 18.9 → 11.8 at 64.
    """

    # NOTE: oneDNN picks the blocked layout for a batch size; 16 was as fast as 1, 64 or
    # 512 for every size measured.
    _BATCH_SIZE_HINT = 16

    def __init__(self, weight: Tensor) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, self._BATCH_SIZE_HINT)

    def linear(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, bias, "none", [], "")


def is_faster(candidate: Callable[[], Tensor], baseline: Callable[[], Tensor], margin: float = 1.0) -> bool:
    """Whether `candidate` runs in less than 1 / `margin` of `baseline`'s time (median of 5, interleaved)."""
    runs = (candidate, baseline)
    times: tuple[list[float], list[float]] = ([], [])
    for repeat in range(7):
        # NOTE: interleaved, so a burst of other load hits both; the first two runs warm up.
        for run, run_times in zip(runs, times, strict=True):
            started = time.perf_counter()
            run()
            if repeat >= 2:
                run_times.append(time.perf_counter() - started)
    return statistics.median(times[0]) * margin < statistics.median(times[1])


def is_plain_matmul_faster(weight: Tensor, packed: PackedWeight, num_rows: int, margin: float = 1.2) -> bool:
    """Whether `x @ weight.T` (stored transposed) beats the packed weight at `num_rows` rows, by `margin`.

    Measured once at load, as oneDNN's blocked layout loses on some shapes: an output head
    with a narrow input (64 features, 49152 outputs, 256 rows) ran in 10.9 ms packed against
    5.9 ms as a plain matmul on one core, while at 576 features packed was ahead (19.1 vs 21.8).
    """
    x = torch.randn(num_rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    transposed = weight.t().contiguous()
    return is_faster(lambda: x @ transposed, lambda: packed.linear(x), margin)


class Linear(nn.Linear):
    """A dense linear layer that, once given 4-bit blocks, runs batches of few tokens on them."""

    int4_weight: Tensor | None
    int4_scales_and_zeros: Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("int4_weight", None, persistent=False)
        self.register_buffer("int4_scales_and_zeros", None, persistent=False)
        # NOTE: not a buffer: oneDNN's layout cannot move devices; `unpack()` drops it.
        self.packed: PackedWeight | None = None

    def prepack(self) -> None:
        """Reorders the loaded dense weight for oneDNN, when this device and dtype have it."""
        self.packed = PackedWeight(self.weight) if is_prepack_supported(self.weight) else None

    def unpack(self) -> None:
        self.packed = None

    def set_int4(self, blocks: Q4Blocks, dtype: torch.dtype) -> None:
        """Packs the blocks (the same weight as `self.weight`) for the int4 kernel."""
        if blocks.codes.shape != self.weight.shape or self.in_features % GROUP_SIZE:
            raise ValueError(f"int4 blocks of shape {tuple(blocks.codes.shape)} for a {tuple(self.weight.shape)} weight")
        device = self.weight.device
        self.int4_weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            blocks.codes.to(device=device, dtype=torch.int32), 1
        )
        zeros = blocks.mins + 8 * blocks.scales
        # NOTE: the kernel wants [cols // 32, rows, 2] pairs of (scale, zero).
        self.int4_scales_and_zeros = (
            torch.stack((blocks.scales, zeros), dim=-1).transpose(0, 1).contiguous().to(device=device, dtype=dtype)
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.int4_weight is None or x.shape[0] > INT4_MAX_TOKENS:
            if self.packed is not None:
                return self.packed.linear(x, self.bias)
            return F.linear(x, self.weight, self.bias)
        assert self.int4_scales_and_zeros is not None
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, self.int4_weight, GROUP_SIZE, self.int4_scales_and_zeros
        )
        return out if self.bias is None else out + self.bias


class Int8Rows(NamedTuple):
    """A weight [rows, cols] as int8 with one scale per row (symmetric), for `x @ weight.T`."""

    weight: Tensor  # [rows, cols] int8
    scales: Tensor  # [rows], the activations' dtype

    @staticmethod
    def quantize(weight: Tensor, dtype: torch.dtype) -> Int8Rows:
        """Per-row absmax int8 of a float32 weight."""
        scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        codes = (weight / scales.unsqueeze(1)).round_().clamp_(-127, 127).to(torch.int8)
        return Int8Rows(codes, scales.to(dtype))

    def matmul(self, x: Tensor) -> Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)
