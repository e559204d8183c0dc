"""torch's own forms of a weight's loaded values (oneDNN's bfloat16 layout, int8 rows, a float32 copy, a
transpose): how each is made, and the facts the registry's rules read to say which weight gets which."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

logger = logging.getLogger(__name__)

# A form's run and the tensors it holds.
Made = tuple[Callable[[Tensor], Tensor], tuple[Tensor, ...]]


@dataclass(frozen=True)
class TorchFormContext:
    """What the registry's rules read about one weight: its role ("projection" or "head"), the forms the
    model asks for on this machine, the forms it has so far, its dtype, whether its file's 4-bit blocks
    run on torch's int4 kernel, and whether int8 rows of it came with it (a head's, from float32 values)."""

    role: str
    asked: tuple[str, ...]
    made: frozenset[str]
    dtype: torch.dtype
    has_int4: bool
    has_int8_rows: bool


class PackedWeight:
    """A dense bfloat16 weight [out, in] reordered once for oneDNN, so no matmul reorders it again.

    `F.linear` on the CPU re-lays out a bfloat16 weight on every call; measured on the
    default model's 120 projections (2 threads, AVX-512): 11.7 → 7.2 ms at 16 tokens, 18.9 → 11.8 at 64.
    """

    # NOTE: oneDNN picks the blocked layout for a batch size; 16 was as fast as 1, 64 or
    # 512 for every size measured.
    _BATCH_SIZE_HINT = 16

    def __init__(self, weight: Tensor) -> None:
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, self._BATCH_SIZE_HINT)

    def linear(self, x: Tensor, bias: Tensor | None = None) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, bias, "none", [], "")

    @staticmethod
    def try_pack(weight: Tensor) -> PackedWeight | None:
        """The packed weight, or None where this CPU, device or dtype has no packing (never raises)."""
        if not is_packing_possible(weight):
            return None
        try:
            packed = PackedWeight(weight)
            packed.linear(torch.zeros(1, weight.shape[1], dtype=weight.dtype))
        except RuntimeError as exc:  # NOTE: oneDNN refuses bfloat16 without native support (AVX2)
            _log_once("oneDNN bfloat16 packing: not used (%s)", str(exc).splitlines()[0])
            return None
        return packed


def is_packing_possible(weight: Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


class Int8Rows:
    """A weight [rows, cols] as int8 with one scale per row (symmetric), for `x @ weight.T`."""

    def __init__(self, weight: Tensor, scales: Tensor) -> None:
        self.weight = weight  # [rows, cols] int8
        self.scales = scales  # [rows], the activations' dtype

    @staticmethod
    def quantize(weight: Tensor, dtype: torch.dtype) -> Int8Rows:
        """Per-row absmax int8 of a weight (computed in float32)."""
        weight = weight.float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        codes = (weight / scales.unsqueeze(1)).round_().clamp_(-127, 127).to(torch.int8)
        return Int8Rows(codes, scales.to(dtype))

    def matmul(self, x: Tensor) -> Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.weight, self.scales)


def make_packed(weight: Tensor, bias: Tensor | None, int8_rows: Int8Rows | None) -> Made | None:
    packed = PackedWeight.try_pack(weight)
    if packed is None:
        return None
    return (lambda x: packed.linear(x, bias)), (packed.weight,)


def make_int8(weight: Tensor, bias: Tensor | None, int8_rows: Int8Rows | None) -> Made:
    int8 = int8_rows if int8_rows is not None else Int8Rows.quantize(weight, weight.dtype)
    run = int8.matmul if bias is None else lambda x: int8.matmul(x) + bias
    return run, (int8.weight, int8.scales)


def make_float32(weight: Tensor, bias: Tensor | None, int8_rows: Int8Rows | None) -> Made:
    values = weight.float()
    wide_bias = None if bias is None else bias.float()
    return (lambda x: F.linear(x.float(), values, wide_bias).to(x.dtype)), (values,) if wide_bias is None else (values, wide_bias)


def make_transposed(weight: Tensor, bias: Tensor | None, int8_rows: Int8Rows | None) -> Made:
    transposed = weight.t().contiguous()
    return ((lambda x: x @ transposed) if bias is None else (lambda x: x @ transposed + bias)), (transposed,)


_logged: set[str] = set()


def _log_once(message: str, *args: object) -> None:
    text = message % args
    if text not in _logged:
        _logged.add(text)
        logger.info(text)
