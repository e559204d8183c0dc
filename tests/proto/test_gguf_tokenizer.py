"""Building tokenizers from GGUF metadata, checked against transformers' own GGUF loader."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import gguf
import pytest

from proto.gguf_header import read_gguf_metadata
from proto.gguf_tokenizer import build_gguf_backend
from service.model_files.tokenizer import Tokenizer

_TEXTS = ["hello the world  123456789", "it's   done\n\n\tok", "naïve café 你好 😀", "<|im_start|>user x"]


def _byte_alphabet_metadata(**overrides: Any) -> dict[str, Any]:
    """Metadata of a byte-level BPE whose vocabulary is just the 256 byte characters."""
    printable = [chr(b) for b in range(ord("!"), ord("~") + 1)]
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": printable, "tokenizer.ggml.merges": []}
    return {**metadata, **overrides}


def test_other_tokenizer_models_are_refused_by_name() -> None:
    with pytest.raises(NotImplementedError, match="'llama'"):
        build_gguf_backend(_byte_alphabet_metadata(**{"tokenizer.ggml.model": "llama"}))


def test_unknown_pre_tokenizer_warns_and_splits_like_gpt2(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        backend = build_gguf_backend(_byte_alphabet_metadata(**{"tokenizer.ggml.pre": "mystery-pre"}))
    assert "mystery-pre" in caplog.text
    assert backend.decode(backend.encode("a+b=c!").ids) == "a+b=c!"


def _write_variant(source: Path, target: Path, overrides: dict[str, Any]) -> None:
    """A tensor-less copy of `source`'s metadata with some keys replaced."""
    metadata = {**read_gguf_metadata(source), **overrides}
    writer = gguf.GGUFWriter(str(target), arch=metadata.pop("general.architecture"))
    for key, value in metadata.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.real_model
@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_split_regex_variants_match_transformers(default_model_path: Path, tmp_path: Path, pre: str) -> None:
    from transformers import AutoTokenizer

    metadata = read_gguf_metadata(default_model_path)
    tokens, token_types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    token_types[1000] = 4  # a user-defined (added, not special) token
    tokens[tokens.index("Ġthe")] = " the"  # spelled as text, not in the byte alphabet
    overrides = {
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types,
    }
    _write_variant(default_model_path, tmp_path / "variant.gguf", overrides)

    ours = Tokenizer.from_model(tmp_path / "variant.gguf")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="variant.gguf")

    assert json.loads(ours.backend.to_str()) == json.loads(theirs.backend_tokenizer.to_str())
    for text in _TEXTS:
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text)
