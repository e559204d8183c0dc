"""The one-line refusal of a model file or folder zeroserve cannot serve, case by case."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from proto.model_support import GGUF_ARCHITECTURES, HF_MODEL_TYPES, TOKENIZER_MODELS, UnsupportedModel, check_servable
from tests.small_model_files import cut_short, with_tensor_type, write_gguf, write_hf_folder


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


def test_a_type_gguf_py_knows_but_the_loader_cannot_read_is_refused(tmp_path: Path) -> None:
    path = with_tensor_type(write_gguf(tmp_path / "m.gguf"), "blk.0.attn_norm.weight", GGMLQuantizationType.I32)
    message = refusal(path)
    assert "'blk.0.attn_norm.weight' has ggml type 26 (I32), which is not supported" in message
    assert "I32" not in message.split("supported: ")[-1]


@pytest.mark.parametrize(
    ("metadata", "tensor_names", "named"),
    [
        ({"qwen2.expert_count": 8, "qwen2.expert_used_count": 2}, (), "mixture-of-experts layers (8 experts)"),
        ({}, ("blk.0.ffn_gate_exps.weight",), "mixture-of-experts layers are not supported"),
    ],
)
def test_a_file_with_experts_its_family_does_not_run_is_refused(
    tmp_path: Path, metadata: dict[str, int], tensor_names: tuple[str, ...], named: str
) -> None:
    message = refusal(write_gguf(tmp_path / "m.gguf", arch="qwen2", metadata=metadata, tensor_names=tensor_names))
    assert message.startswith(f"m.gguf: {named}") and "for 'qwen2'; supported: dense models, and experts in " in message


def test_a_llama_file_with_experts_is_a_mixtral(tmp_path: Path) -> None:
    """llama.cpp names Mixtral's files `llama`: their experts are run."""
    check_servable(write_gguf(tmp_path / "m.gguf", metadata={"llama.expert_count": 8}))


@pytest.mark.parametrize("config", [{"num_local_experts": 8}, {"num_experts": 64}])
def test_a_folder_with_experts_is_refused(tmp_path: Path, config: dict[str, int]) -> None:
    message = refusal(write_hf_folder(tmp_path / "m", model_type="mistral", config=config))
    assert message.startswith("m: mixture-of-experts layers (") and "not supported for 'mistral'" in message


@pytest.mark.parametrize("scaling", ["longrope", "dynamic"])
def test_a_gguf_rope_scaling_the_loader_does_not_read_is_refused(tmp_path: Path, scaling: str) -> None:
    message = refusal(write_gguf(tmp_path / "m.gguf", arch="qwen2", metadata={"qwen2.rope.scaling.type": scaling}))
    assert f"rope scaling {scaling!r} is not supported; supported: default, linear, llama3, yarn" in message


@pytest.mark.parametrize("scaling", ["none", "linear", "yarn"])
def test_a_gguf_rope_scaling_the_loader_reads_passes(tmp_path: Path, scaling: str) -> None:
    check_servable(write_gguf(tmp_path / "m.gguf", metadata={"llama.rope.scaling.type": scaling}))


@pytest.mark.parametrize(("rotary_dims", "is_refused"), [(8, True), (16, False)])
def test_rotary_embeddings_over_part_of_a_head_are_refused(tmp_path: Path, rotary_dims: int, is_refused: bool) -> None:
    metadata = {"llama.embedding_length": 64, "llama.attention.head_count": 4, "llama.rope.dimension_count": rotary_dims}
    path = write_gguf(tmp_path / "m.gguf", metadata=metadata)
    if is_refused:
        assert refusal(path).startswith("m.gguf: partial rotary embeddings (8 of 16 dims a head) are not supported")
    else:
        check_servable(path)


@pytest.mark.parametrize("num_bytes", [0, 3, 30, 200, -4])
def test_a_cut_short_file_is_refused_naming_it(tmp_path: Path, num_bytes: int) -> None:
    path = write_gguf(tmp_path / "m.gguf")
    message = refusal(cut_short(path, num_bytes % path.stat().st_size))
    assert message.startswith("m.gguf is cut short: ") and message.endswith("(an interrupted download?)")


def test_vocabulary_only_file_is_refused(tmp_path: Path) -> None:
    assert "holds no tensors" in refusal(write_gguf(tmp_path / "m.gguf", num_tensors=0))


def test_not_a_gguf_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"not a gguf at all")
    assert "m.gguf is not a GGUF file" in refusal(path)


def test_folder_of_unknown_model_type_is_named_with_the_supported_ones(tmp_path: Path) -> None:
    message = refusal(write_hf_folder(tmp_path / "m", model_type="mamba"))
    assert "model_type 'mamba' is not supported" in message
    assert all(model_type in message for model_type in HF_MODEL_TYPES)


def test_folder_without_tokenizer_json_is_refused(tmp_path: Path) -> None:
    assert "has no tokenizer.json" in refusal(write_hf_folder(tmp_path / "m", has_tokenizer=False))


def test_folder_with_unsupported_rope_scaling_is_refused(tmp_path: Path) -> None:
    message = refusal(write_hf_folder(tmp_path / "m", model_type="phi3", rope_type="longrope"))
    assert "rope scaling 'longrope' is not supported; supported: default, linear, llama3, yarn" in message
