"""Reading a GGUF header: every metadata value type comes back as written, and each tensor is
where `gguf.GGUFReader` finds it."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from proto.gguf_header import read_gguf_header, read_gguf_metadata
from tests.small_model_files import cut_short, write_gguf


def test_reads_back_what_gguf_writer_wrote(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_uint32("llama.block_count", 30)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "你好", "😀"])
    writer.add_array("tokenizer.ggml.token_type", [1, 3, 4, 1])
    writer.add_tensor("weight", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    metadata = read_gguf_metadata(path)

    assert metadata["general.architecture"] == "llama"
    assert metadata["llama.block_count"] == 30
    assert metadata["llama.rope.freq_base"] == 10000.0
    assert metadata["tokenizer.ggml.add_bos_token"] is True
    assert metadata["tokenizer.ggml.model"] == "gpt2"
    assert metadata["tokenizer.ggml.tokens"] == ["a", "b", "你好", "😀"]
    assert metadata["tokenizer.ggml.token_type"] == [1, 3, 4, 1]


def test_rejects_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"not a gguf file at all, just text" * 4)
    with pytest.raises(ValueError, match="not a GGUF"):
        read_gguf_metadata(path)


def test_tensors_lie_where_gguf_reader_finds_them(tmp_path: Path) -> None:
    path = tmp_path / "tensors.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_uint32("general.alignment", 64)
    rng = np.random.default_rng(0)
    writer.add_tensor("norm.weight", rng.standard_normal(7).astype(np.float32))
    for name, quant in (("a.weight", gguf.GGMLQuantizationType.Q4_1), ("b.weight", gguf.GGMLQuantizationType.Q8_0)):
        weight = rng.standard_normal((3, 64)).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(weight, quant), raw_dtype=quant)
    writer.add_tensor("c.weight", rng.standard_normal((2, 5, 3)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    header = read_gguf_header(path)

    expected = [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset))
        for t in gguf.GGUFReader(path).tensors
    ]
    assert [(t.name, t.shape, t.ggml_type, t.offset) for t in header.tensors] == expected
    assert [t.shape for t in header.tensors] == [(7,), (64, 3), (64, 3), (3, 5, 2)]


def cut_points(path: Path) -> dict[str, int]:
    """Where an interrupted download of the small GGUF may end: inside each part of its header, and of its data."""
    (tensor,) = read_gguf_header(path).tensors
    num_bytes = path.stat().st_size
    return {
        "magic": 2, "counts": 12, "metadata": tensor.offset // 3, "tensor table": tensor.offset - 40,
        "padding": tensor.offset - 1, "data start": tensor.offset, "data": num_bytes - 4,
    }


@pytest.mark.parametrize("where", ["magic", "counts", "metadata", "tensor table", "padding", "data start", "data"])
def test_a_file_cut_short_anywhere_is_one_line_naming_it(tmp_path: Path, where: str) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    num_bytes = path.stat().st_size
    cut_short(path, cut_points(path)[where])
    with pytest.raises(ValueError) as caught:
        read_gguf_header(path)
    message = str(caught.value)
    assert message.startswith("m.gguf is cut short: ") and message.endswith(" (an interrupted download?)")
    assert "\n" not in message
    if where in ("padding", "data start", "data"):
        assert f"its tensors need {num_bytes:,} bytes, the file has {path.stat().st_size:,}" in message


def test_an_empty_file_is_cut_short(tmp_path: Path) -> None:
    (path := tmp_path / "m.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^m.gguf is cut short: the file holds 0 bytes"):
        read_gguf_header(path)


def test_a_whole_file_reads(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    assert [tensor.name for tensor in read_gguf_header(path).tensors] == ["blk.0.attn_norm.weight"]
