"""Reading GGUF metadata: every value type comes back as written."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from service.model_files.gguf_metadata import read_gguf_metadata


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
