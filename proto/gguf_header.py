"""A GGUF file's header: its key-value metadata and where each tensor lies, read without
touching the tensors (the gateway's tokenizer and the engine's loader both start here).

NOTE: `gguf.GGUFReader` builds a numpy view per array element: 6.7 s for the default model's
49k-token vocabulary on a 2-core Xeon (100 s under QEMU), every engine start; walking the header
with `struct` over an mmap takes about 0.1 s.

Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 key-value count,
then per key: string key, u32 value type, value. A string is u64 length + UTF-8 bytes; an
array is u32 element type + u64 count + elements. Then per tensor: string name, u32 number of
dimensions, u64 each (innermost first), u32 ggml type, u64 offset into the data section, which
starts at the next multiple of `general.alignment` (32 unless set).

A file that ends inside its header, or before the last byte its tensor table says its tensors need
(an interrupted download), is refused here in one line, reading none of the tensors' bytes.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES

_SUPPORTED_VERSIONS = (2, 3)
_STRING, _ARRAY = 8, 9
# value type id -> struct format of the fixed-size scalar types
_SCALAR_FORMATS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}


_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # NOTE: ggml's GGML_MAX_DIMS
_INTERRUPTED = "(an interrupted download?)"
# ggml type id -> (values a block, bytes a block)
_BLOCK_SIZES = {int(ggml_type): sizes for ggml_type, sizes in GGML_QUANT_SIZES.items()}


class _CutShort(Exception):
    """The header reaches past the end of the file."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """Where one tensor's bytes lie in the file, and what they hold."""

    name: str
    shape: tuple[int, ...]  # innermost dimension first, as GGUF stores it
    ggml_type: int  # gguf.GGMLQuantizationType's value
    offset: int  # from the start of the file


@dataclass(frozen=True)
class GGUFHeader:
    """A GGUF file's metadata (arrays as lists) and its tensors, in file order."""

    metadata: dict[str, Any]
    tensors: tuple[GGUFTensorInfo, ...]


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """All metadata keys of a GGUF file; arrays come back as lists."""
    return read_gguf_header(path).metadata


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """The metadata and the tensor table of a GGUF file; a ValueError, one line naming the file, for a file
    that is not one, is cut short (in its header or before its tensors' last byte) or is corrupt."""
    name = Path(path).name
    with open(path, "rb") as file:
        num_file_bytes = os.fstat(file.fileno()).st_size
        if num_file_bytes < 4 and b"GGUF".startswith(file.read()):
            raise ValueError(f"{name} is cut short: the file holds {num_file_bytes} bytes {_INTERRUPTED}")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as blob:
            if blob[:4] != b"GGUF":
                raise ValueError(f"{name} is not a GGUF file (it does not begin with the bytes 'GGUF')")
            try:
                header = _read_header(name, _Reader(blob, 4))
            except _CutShort:
                raise ValueError(
                    f"{name} is cut short: the file ends inside its header, at {num_file_bytes:,} bytes {_INTERRUPTED}"
                ) from None
    num_needed = max((info.offset + _num_tensor_bytes(name, info) for info in header.tensors), default=0)
    if num_needed > num_file_bytes:
        raise ValueError(
            f"{name} is cut short: its tensors need {num_needed:,} bytes, the file has {num_file_bytes:,} {_INTERRUPTED}"
        )
    return header


def _read_header(name: str, reader: _Reader) -> GGUFHeader:
    version, num_tensors, num_keys = reader.scalar("I"), reader.scalar("Q"), reader.scalar("Q")
    if version not in _SUPPORTED_VERSIONS:
        raise ValueError(f"{name} is GGUF version {version}; supported: {_SUPPORTED_VERSIONS}.")
    metadata: dict[str, Any] = {}
    for _ in range(num_keys):
        key = reader.string()
        metadata[key] = reader.value(reader.scalar("I"))
    entries = []
    for _ in range(num_tensors):
        tensor_name = reader.string()
        num_dims = reader.scalar("I")
        if num_dims > _MAX_DIMS:
            raise ValueError(f"{name} is corrupt: tensor {tensor_name!r} has {num_dims} dimensions (GGUF allows {_MAX_DIMS})")
        shape = tuple(reader.scalar("Q") for _ in range(num_dims))
        entries.append((tensor_name, shape, reader.scalar("I"), reader.scalar("Q")))
    alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0:
        raise ValueError(f"{name} is corrupt: its general.alignment is {alignment!r}")
    data_start = -(-reader.pos // alignment) * alignment
    tensors = tuple(
        GGUFTensorInfo(tensor_name, shape, ggml_type, data_start + offset)
        for tensor_name, shape, ggml_type, offset in entries
    )
    return GGUFHeader(metadata, tensors)


def _num_tensor_bytes(name: str, info: GGUFTensorInfo) -> int:
    """Bytes of the tensor's data (0 for a ggml type gguf-py does not know: the type check refuses it)."""
    if info.ggml_type not in _BLOCK_SIZES:
        return 0
    block_size, block_bytes = _BLOCK_SIZES[info.ggml_type]
    if info.shape and info.shape[0] % block_size:
        raise ValueError(
            f"{name} is corrupt: tensor {info.name!r} has rows of {info.shape[0]} values, "
            f"not a whole number of its type's blocks of {block_size}"
        )
    return math.prod(info.shape) // block_size * block_bytes


class _Reader:
    """A cursor over the metadata section."""

    def __init__(self, blob: mmap.mmap, pos: int) -> None:
        self.blob = blob
        self.pos = pos

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.blob, self._advance(struct.calcsize(fmt)))
        return value

    def string(self) -> str:
        start = self._advance(self.scalar("Q"))
        return self.blob[start : self.pos].decode("utf-8", errors="replace")

    def _advance(self, num_bytes: int) -> int:
        """The position, moved `num_bytes` on (_CutShort past the end of the file)."""
        start, self.pos = self.pos, self.pos + num_bytes
        if self.pos > len(self.blob):
            raise _CutShort
        return start

    def value(self, value_type: int) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            element_type, count = self.scalar("I"), self.scalar("Q")
            if element_type in _SCALAR_FORMATS:
                item_format = _SCALAR_FORMATS[element_type]
                start = self._advance(count * struct.calcsize(item_format))
                return list(struct.unpack_from(f"<{count}{item_format}", self.blob, start))
            return [self.value(element_type) for _ in range(count)]
        raise ValueError(f"Unknown GGUF metadata value type {value_type} at offset {self.pos}.")
