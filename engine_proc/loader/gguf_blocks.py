"""The arrays of a GGUF tensor's blocks, one reader a block type: its raw bytes [rows, row bytes] as the codes,
scales and minimums weight_blocks' kinds hold (each block type's layout told where it is read)."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from gguf import GGMLQuantizationType

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


def affine_arrays(raw_bytes: np.ndarray, has_min: bool, has_fifth_bit: bool) -> tuple[np.ndarray, ...]:
    """(codes, scales, mins) of a Q4_0, Q4_1, Q5_0 or Q5_1 tensor: w = code * scale + min per block of 32.

    A block is a float16 scale (Q4_1, Q5_1: then a float16 min; Q5_0, Q5_1: then 32 fifth bits, element
    j's at bit j of a little-endian word) and 16 bytes of codes, element j in the low nibble of byte j
    and element j + 16 in the high nibble. Without a min: w = (code − 8) * scale (Q5_0: − 16).
    """
    header = (4 if has_min else 2) + (4 if has_fifth_bit else 0)
    num_rows = raw_bytes.shape[0]
    raw = raw_bytes.reshape(num_rows, -1, header + 16)
    scales = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = raw[..., header:]
    codes = np.concatenate((packed & 0x0F, packed >> 4), axis=-1)
    if has_fifth_bit:
        bits = np.unpackbits(raw[..., header - 4 : header], axis=-1, bitorder="little")
        codes |= bits << 4
    mins = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if has_min else -(16 if has_fifth_bit else 8) * scales
    return codes.reshape(num_rows, -1), scales, mins


def k_arrays(raw_bytes: np.ndarray, has_fifth_bit: bool) -> tuple[np.ndarray, ...]:
    """(codes, scales, mins, d, dmin) of a Q4_K or Q5_K tensor. A super-block of 256 is a float16 d, a
    float16 dmin, 12 bytes of 6-bit scales and minimums for its 8 groups (ggml's get_scale_min_k4
    packing: groups 0-3 in the low 6 bits of bytes 0-3 and 4-7, groups 4-7 in the nibbles of bytes 8-11
    with their top 2 bits in the top bits of bytes 0-7), (Q5_K: 32 bytes of fifth bits, group g's
    element l at bit g of byte l,) then 128 bytes of codes: 32 bytes for each two groups, the first
    group in their low nibbles, the second in their high ones."""
    num_rows = raw_bytes.shape[0]
    raw = raw_bytes.reshape(num_rows, -1, 176 if has_fifth_bit else 144)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    packed = raw[..., 4:16]
    low, high, both = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate((low & 63, (both & 0xF) | ((low >> 6) << 4)), axis=-1).reshape(num_rows, -1)
    mins = np.concatenate((high & 63, (both >> 4) | ((high >> 6) << 4)), axis=-1).reshape(num_rows, -1)
    pairs = raw[..., -128:].reshape(num_rows, -1, 4, 1, 32)
    codes = np.concatenate((pairs & 0x0F, pairs >> 4), axis=3).reshape(num_rows, -1, 8, 32)
    if has_fifth_bit:
        high = raw[..., 16:48].reshape(num_rows, -1, 1, 32)
        codes |= ((high >> np.arange(8, dtype=np.uint8).reshape(8, 1)) & 1) << 4
    return codes.reshape(num_rows, -1), scales, mins, d, dmin


def q6k_arrays(raw_bytes: np.ndarray) -> tuple[np.ndarray, ...]:
    """(codes, scales, d) of a Q6_K tensor. A super-block of 256 is 128 bytes of low nibbles, 64 bytes of
    top bit pairs, 16 signed 8-bit scales (one per 16) and a float16 d. Each half of 128 has 64 low-nibble
    bytes (its quarters 0 and 1 in the low nibbles of bytes 0-31 and 32-63, quarters 2 and 3 in their
    high nibbles) and 32 bytes of pairs (quarter j's top two bits at bits 2j, 2j + 1 of byte l)."""
    num_rows = raw_bytes.shape[0]
    raw = raw_bytes.reshape(num_rows, -1, 210)
    low = raw[..., 0:128].reshape(num_rows, -1, 2, 2, 32)
    high = raw[..., 128:192].reshape(num_rows, -1, 2, 1, 32)
    lows = np.concatenate((low & 0x0F, low >> 4), axis=3)
    highs = (high >> np.array([0, 2, 4, 6], np.uint8).reshape(4, 1)) & 3
    codes = (lows | (highs << 4)).reshape(num_rows, -1)
    scales = raw[..., 192:208].copy().view(np.int8).reshape(num_rows, -1)
    d = raw[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    return codes, scales, d


def iq4xs_arrays(raw_bytes: np.ndarray) -> tuple[np.ndarray, ...]:
    """(indices, scales, d) of an IQ4_XS tensor. A super-block of 256 is a float16 d, 16 bits of the
    scales' top two bits (group g's at bits 2g, 2g + 1), 4 bytes of their low nibbles (group g's in
    byte g // 2, the high nibble for odd g), then 16 bytes of indices per group (element j in the
    low nibble of byte j, element j + 16 in its high one); a group's scale is those 6 bits − 32."""
    num_rows = raw_bytes.shape[0]
    raw = raw_bytes.reshape(num_rows, -1, 136)
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    high = raw[..., 2:4].copy().view(np.uint16)[..., 0:1] >> (2 * np.arange(8, dtype=np.uint16)) & 3
    low = raw[..., 4:8].repeat(2, axis=-1) >> np.tile(np.array([0, 4], np.uint8), 4) & 0x0F
    scales = ((low | (high.astype(np.uint8) << 4)).astype(np.int16) - 32).astype(np.int8).reshape(num_rows, -1)
    packed = raw[..., 8:].reshape(num_rows, -1, 8, 16)
    codes = np.concatenate((packed & 0x0F, packed >> 4), axis=-1).reshape(num_rows, -1)
    return codes, scales, d


def mxfp4_arrays(raw_bytes: np.ndarray) -> tuple[np.ndarray, ...]:
    """(codes, exponents) of an MXFP4 tensor. A block of 32 is an 8-bit exponent (e8m0), then 16 bytes of
    codes, element j in the low nibble of byte j and element j + 16 in its high one."""
    num_rows = raw_bytes.shape[0]
    raw = raw_bytes.reshape(num_rows, -1, 17)
    codes = np.concatenate((raw[..., 1:] & 0x0F, raw[..., 1:] >> 4), axis=-1).reshape(num_rows, -1)
    return codes, raw[..., 0]


def q8_arrays(raw_bytes: np.ndarray) -> tuple[np.ndarray, ...]:
    """(codes, scales) of a Q8_0 tensor: w = code * scale per block of 32 (a float16 scale, then 32 int8 codes)."""
    raw = raw_bytes.reshape(raw_bytes.shape[0], -1, 34)
    scales = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    codes = raw[..., 2:].copy().view(np.int8).reshape(raw_bytes.shape[0], -1)
    return codes, scales


class BlockType(NamedTuple):
    """One GGUF block type as zeroserve holds it: the weight_blocks kind of its blocks (which kernel forms
    take, see form_registry), and the reader of its arrays from the file's bytes."""

    kind: BlocksKind
    arrays: Callable[[np.ndarray], tuple[np.ndarray, ...]]

    def blocks(self, raw_bytes: np.ndarray, arrange: Callable[[np.ndarray], np.ndarray] = lambda a: a) -> Blocks:
        """The blocks of `raw_bytes` [rows, row bytes], each array through `arrange` (the loader's row order)."""
        return self.kind(*(torch.from_numpy(np.ascontiguousarray(arrange(a))) for a in self.arrays(raw_bytes)))


# The block types whose blocks zeroserve keeps as the file holds them, one entry each: the loader reads
# them by this table, and a kernel form takes the kind it names.
BLOCK_TYPES: dict[GGMLQuantizationType, BlockType] = {
    GGMLQuantizationType.Q4_0: BlockType(Q4Blocks, lambda raw: affine_arrays(raw, has_min=False, has_fifth_bit=False)),
    GGMLQuantizationType.Q4_1: BlockType(Q4Blocks, lambda raw: affine_arrays(raw, has_min=True, has_fifth_bit=False)),
    GGMLQuantizationType.Q5_0: BlockType(Q5Blocks, lambda raw: affine_arrays(raw, has_min=False, has_fifth_bit=True)),
    GGMLQuantizationType.Q5_1: BlockType(Q5Blocks, lambda raw: affine_arrays(raw, has_min=True, has_fifth_bit=True)),
    GGMLQuantizationType.Q4_K: BlockType(Q4KBlocks, lambda raw: k_arrays(raw, has_fifth_bit=False)),
    GGMLQuantizationType.Q5_K: BlockType(Q5KBlocks, lambda raw: k_arrays(raw, has_fifth_bit=True)),
    GGMLQuantizationType.Q6_K: BlockType(Q6KBlocks, q6k_arrays),
    GGMLQuantizationType.IQ4_XS: BlockType(IQ4XSBlocks, iq4xs_arrays),
    GGMLQuantizationType.MXFP4: BlockType(MXFP4Blocks, mxfp4_arrays),
    GGMLQuantizationType.Q8_0: BlockType(Q8Blocks, q8_arrays),
}
