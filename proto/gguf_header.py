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
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SUPPORTED_VERSIONS = (2, 3)
_STRING, _ARRAY = 8, 9
# value type id -> struct format of the fixed-size scalar types
_SCALAR_FORMATS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}


_DEFAULT_ALIGNMENT = 32


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
    """The metadata and the tensor table of a GGUF file (ValueError for a file that is not one)."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        if blob[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic bytes).")
        version, num_tensors, num_keys = struct.unpack_from("<IQQ", blob, 4)
        if version not in _SUPPORTED_VERSIONS:
            raise ValueError(f"{path} is GGUF version {version}; supported: {_SUPPORTED_VERSIONS}.")
        reader = _Reader(blob, 24)
        metadata: dict[str, Any] = {}
        for _ in range(num_keys):
            key = reader.string()
            metadata[key] = reader.value(reader.scalar("I"))
        entries = []
        for _ in range(num_tensors):
            name = reader.string()
            shape = tuple(reader.scalar("Q") for _ in range(reader.scalar("I")))
            entries.append((name, shape, reader.scalar("I"), reader.scalar("Q")))
        alignment = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        data_start = -(-reader.pos // alignment) * alignment
        tensors = tuple(
            GGUFTensorInfo(name, shape, ggml_type, data_start + offset) for name, shape, ggml_type, offset in entries
        )
        return GGUFHeader(metadata, tensors)


class _Reader:
    """A cursor over the metadata section."""

    def __init__(self, blob: mmap.mmap, pos: int) -> None:
        self.blob = blob
        self.pos = pos

    def scalar(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.blob, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.scalar("Q")
        start, self.pos = self.pos, self.pos + length
        return self.blob[start : self.pos].decode("utf-8", errors="replace")

    def value(self, value_type: int) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.scalar(_SCALAR_FORMATS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type == _ARRAY:
            element_type, count = self.scalar("I"), self.scalar("Q")
            if element_type in _SCALAR_FORMATS:
                fmt = f"<{count}{_SCALAR_FORMATS[element_type]}"
                values = list(struct.unpack_from(fmt, self.blob, self.pos))
                self.pos += struct.calcsize(fmt)
                return values
            return [self.value(element_type) for _ in range(count)]
        raise ValueError(f"Unknown GGUF metadata value type {value_type} at offset {self.pos}.")
