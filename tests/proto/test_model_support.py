"""The one-line refusal of a model file or folder zeroserve cannot serve, case by case."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto.model_support import GGUF_ARCHITECTURES, HF_MODEL_TYPES, TOKENIZER_MODELS, UnsupportedModel, check_servable
from tests.small_model_files import with_tensor_type, write_gguf, write_hf_folder


def refusal(path: Path) -> str:
    with pytest.raises(UnsupportedModel) as caught:
        check_servable(path)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_servable_file_and_folder_pass(tmp_path: Path) -> None:
    check_servable(write_gguf(tmp_path / "ok.gguf"))
    check_servable(write_hf_folder(tmp_path / "ok"))


def test_unknown_architecture_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    message = refusal(write_gguf(tmp_path / "m.gguf", arch="mamba"))
    assert "architecture 'mamba' is not supported" in message
    assert all(arch in message for arch in GGUF_ARCHITECTURES)


def test_unknown_tokenizer_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    message = refusal(write_gguf(tmp_path / "m.gguf", tokenizer="rwkv"))
    assert "tokenizer 'rwkv' is not supported" in message
    assert all(model in message for model in TOKENIZER_MODELS)


def test_unknown_tensor_type_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    path = with_tensor_type(write_gguf(tmp_path / "m.gguf"), "blk.0.attn_norm.weight", 250)
    message = refusal(path)
    assert "'blk.0.attn_norm.weight' has ggml type 250, which is not supported" in message
    assert "Q4_K" in message and "Q8_0" in message


def test_vocabulary_only_file_is_refused(tmp_path: Path) -> None:
    assert "holds no tensors" in refusal(write_gguf(tmp_path / "m.gguf", num_tensors=0))


def test_not_a_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"not a gguf at all")
    assert "not a readable GGUF file" in refusal(path)


def test_folder_of_unknown_model_type_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    message = refusal(write_hf_folder(tmp_path / "m", model_type="mamba"))
    assert "model_type 'mamba' is not supported" in message
    assert all(model_type in message for model_type in HF_MODEL_TYPES)


def test_folder_without_tokenizer_json_is_refused(tmp_path: Path) -> None:
    assert "has no tokenizer.json" in refusal(write_hf_folder(tmp_path / "m", has_tokenizer=False))


def test_folder_with_unsupported_rope_scaling_is_refused(tmp_path: Path) -> None:
    message = refusal(write_hf_folder(tmp_path / "m", model_type="phi3", rope_type="longrope"))
    assert "rope scaling 'longrope' is not supported; supported: default, linear, llama3" in message
