"""Reading a GGUF file's key-value metadata without touching its tensors.

NOTE: `gguf.GGUFReader` builds a numpy view per array element, which takes about 2.5 s on
a 49k-token vocabulary; walking the header with `struct` over an mmap takes about 0.1 s.

Layout (little-endian): magic "GGUF", u32 version, u64 tensor count, u64 key-value count,
then per key: string key, u32 value type, value. A string is u64 length + UTF-8 bytes; an
array is u32 element type + u64 count + elements.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

_SUPPORTED_VERSIONS = (2, 3)
_STRING, _ARRAY = 8, 9
# value type id -> struct format of the fixed-size scalar types
_SCALAR_FORMATS = {
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}


def read_gguf_metadata(path: Path) -> dict[str, Any]:
    """All metadata keys of a GGUF file; arrays come back as lists."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        if blob[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic bytes).")
        version, _num_tensors, num_keys = struct.unpack_from("<IQQ", blob, 4)
        if version not in _SUPPORTED_VERSIONS:
            raise ValueError(f"{path} is GGUF version {version}; supported: {_SUPPORTED_VERSIONS}.")
        reader = _Reader(blob, 24)
        metadata: dict[str, Any] = {}
        for _ in range(num_keys):
            key = reader.string()
            metadata[key] = reader.value(reader.scalar("I"))
        return metadata


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
