"""Small model files and folders for the tests that resolve or refuse them: a GGUF of a chosen architecture, tokenizer and
tensor type, a Hugging Face folder of a chosen model_type."""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path

import gguf
import numpy as np


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    tokenizer: str = "gpt2",
    num_tensors: int = 1,
    metadata: Mapping[str, int | str] | None = None,
    tensor_names: Sequence[str] = (),
) -> Path:
    """A small GGUF: an architecture, a tokenizer model, `metadata` (ints as uint32), and `num_tensors`
    float32 tensors (then one of each of `tensor_names`)."""
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_string("tokenizer.ggml.model", tokenizer)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b"])
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_uint32(key, value)
    names = [f"blk.{index}.attn_norm.weight" for index in range(num_tensors)] + list(tensor_names)
    for name in names:
        writer.add_tensor(name, np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def with_tensor_type(path: Path, tensor_name: str, ggml_type: int) -> Path:
    """The file with one 1-D tensor's ggml type id rewritten in its header (a type from the future)."""
    data = bytearray(path.read_bytes())
    name = tensor_name.encode()
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    (num_dims,) = struct.unpack_from("<I", data, at)
    struct.pack_into("<I", data, at + 4 + 8 * num_dims, ggml_type)
    path.write_bytes(bytes(data))
    return path


def cut_short(path: Path, num_bytes: int) -> Path:
    """The file cut to its first `num_bytes` (an interrupted download)."""
    with path.open("r+b") as file:
        file.truncate(num_bytes)
    return path


def write_hf_folder(
    path: Path,
    *,
    model_type: str = "llama",
    has_tokenizer: bool = True,
    rope_type: str = "default",
    config: Mapping[str, object] | None = None,
) -> Path:
    """A Hugging Face folder: config.json of `model_type` and `rope_type` (and `config`), tokenizer.json,
    an empty safetensors file."""
    path.mkdir()
    fields = {"model_type": model_type, "rope_scaling": {"rope_type": rope_type}, **(config or {})}
    (path / "config.json").write_text(json.dumps(fields))
    if has_tokenizer:
        (path / "tokenizer.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"")
    return path
