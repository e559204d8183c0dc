"""GGUF loading: tiny hand-written GGUFs and the real default model, against Hugging Face."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers

from engine_proc.cpu.quantized_linear import INT4_MAX_TOKENS
from engine_proc.loader import load_gguf, load_model, load_model_config
from engine_proc.loader.gguf_blocks import BLOCK_TYPES
from engine_proc.models.rope import attention_factor, inverse_frequencies
from proto.model_support import GGML_TYPES
from tests.engine_proc.models.tiny_llama import TINY, run, save_tiny_checkpoint

GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Reorder Q/K rows the way llama.cpp's convert_hf_to_gguf.py does for llama models."""
    return (
        weight.reshape(num_heads, 2, weight.shape[0] // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def gguf_name(hf_name: str) -> str:
    globals_ = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf_name in globals_:
        return globals_[hf_name]
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    module, suffix = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_LAYER_NAMES[module]}.{suffix}"


def write_tiny_gguf(
    path: Path, hf_model: transformers.PreTrainedModel, quant: gguf.GGMLQuantizationType | None = None
) -> None:
    """Write the tiny HF llama as a llama-architecture GGUF, as llama.cpp would: F32, or the
    projections in `quant`."""
    config = hf_model.config
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_token_list([f"<t{i}>" for i in range(config.vocab_size)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if config.rope_parameters["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(config.rope_parameters["factor"])
    if config.rope_parameters["rope_type"] == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(config.rope_parameters["factor"])
        writer.add_rope_scaling_orig_ctx_len(config.rope_parameters["original_max_position_embeddings"])
    if config.rope_parameters["rope_type"] == "llama3":
        ours = load_model_config(path.parent)
        unscaled = dataclasses.replace(ours, rope_scaling=None)
        writer.add_rope_scaling_orig_ctx_len(config.rope_parameters["original_max_position_embeddings"])
        writer.add_tensor(
            "rope_freqs.weight", (inverse_frequencies(unscaled) / inverse_frequencies(ours)).numpy()
        )
    for name, tensor in hf_model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        array = tensor.numpy().copy()
        if name.endswith("q_proj.weight"):
            array = permute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = permute(array, config.num_key_value_heads)
        if quant is not None and "proj" in name:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(array, quant), raw_dtype=quant)
        else:
            writer.add_tensor(gguf_name(name), array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("kind", ["llama", "llama-tied-llama3-rope", "llama-linear-rope", "llama-yarn-rope"])
def test_tiny_gguf_logits_match_hugging_face(tmp_path: Path, kind: str) -> None:
    hf_model = save_tiny_checkpoint(tmp_path, kind)
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_path, hf_model)
    hf_config = load_model_config(tmp_path)
    gguf_config = load_model_config(gguf_path)
    for field in ("tie_word_embeddings", "head_dim", "num_key_value_heads", "rope_theta"):
        assert getattr(gguf_config, field) == getattr(hf_config, field)
    # NOTE: YaRN's parameters as llama.cpp reads them (its defaults spelled out), the same frequencies and factor
    assert torch.equal(inverse_frequencies(gguf_config), inverse_frequencies(hf_config))
    assert attention_factor(gguf_config) == attention_factor(hf_config)

    model = load_model(gguf_path, dtype="float32", quantization="none")
    prompt = torch.randint(0, TINY["vocab_size"], (40,))
    with torch.no_grad():
        expected = hf_model(prompt[None]).logits[0]
    torch.testing.assert_close(run(model, [prompt]), expected, atol=1e-4, rtol=0)


def write_one_tensor_of_each_type(path: Path, types: list[gguf.GGMLQuantizationType]) -> None:
    """A llama GGUF whose layer i's up projection is 2 rows of 256 zero-byte values of `types[i]`."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(len(types))
    writer.add_context_length(64)
    writer.add_embedding_length(256)
    writer.add_feed_forward_length(2)
    writer.add_head_count(4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_token_list(["a", "b"])
    for layer, ggml_type in enumerate(types):
        block_size, block_bytes = gguf.GGML_QUANT_SIZES[ggml_type]
        row = np.zeros((2, 256 // block_size * block_bytes), dtype=np.uint8)
        writer.add_tensor(f"blk.{layer}.ffn_up.weight", row, raw_dtype=ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_supported_tensor_types_are_those_the_loader_reads(tmp_path: Path) -> None:
    """proto's list of supported ggml types (what the gateway accepts) is what this loader reads: each type on
    it comes back as float32 values, and each type off it has neither a kernel form's blocks nor a conversion."""
    supported = sorted(GGML_TYPES)
    write_one_tensor_of_each_type(tmp_path / "types.gguf", supported)
    _, weights = load_gguf(tmp_path / "types.gguf")
    for layer, ggml_type in enumerate(supported):
        values = weights.float(f"model.layers.{layer}.mlp.up_proj.weight")
        assert (values.dtype, tuple(values.shape)) == (torch.float32, (2, 256)), ggml_type.name
    assert set(BLOCK_TYPES) <= GGML_TYPES
    for ggml_type in set(gguf.GGMLQuantizationType) - GGML_TYPES:
        with pytest.raises(NotImplementedError):
            gguf.quants.dequantize(np.zeros((1, gguf.GGML_QUANT_SIZES[ggml_type][1]), dtype=np.uint8), ggml_type)


def test_mxfp4_blocks_hold_gguf_pys_values_for_every_exponent_and_code() -> None:
    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    raw = np.random.default_rng(0).integers(0, 256, (16, 16 * 17), dtype=np.uint8)
    raw.reshape(16, 16, 17)[..., 0] = np.arange(256, dtype=np.uint8).reshape(16, 16)
    with np.errstate(over="ignore"):  # NOTE: from exponent 253 on, 12 · 2^(E − 128) is past float32's range
        theirs = gguf.quants.dequantize(raw, mxfp4)
    blocks = BLOCK_TYPES[mxfp4].blocks(raw)
    ours = blocks.dequantize().numpy()
    assert ours.shape == theirs.shape == (16, 512) and np.isinf(theirs).any() and (theirs[theirs != 0] < 1e-38).any()
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.parametrize("quant", [gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_1])
def test_4bit_gguf_runs_its_blocks_as_int4(tmp_path: Path, quant: gguf.GGMLQuantizationType) -> None:
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_path, save_tiny_checkpoint(tmp_path, "llama"), quant)
    reference = load_model(gguf_path, dtype="float32", quantization="none")
    reader_tensor = next(t for t in gguf.GGUFReader(gguf_path).tensors if t.name == "blk.0.ffn_down.weight")
    expected_down = gguf.quants.dequantize(reader_tensor.data, reader_tensor.tensor_type)
    assert np.array_equal(reference.model.layers[0].mlp.down_proj.weight.numpy(), expected_down)

    # NOTE: the plan by batch size, whose int4 serves these few tokens (batch-invariant, int4_q8 and an
    # int8_q8 head round the activations to 8 bits too: tests/engine_proc/test_fidelity_int4.py bounds that).
    model = load_model(gguf_path, dtype=torch.bfloat16, quantization="gguf", batch_invariant=False)
    projections = [module for name, module in model.named_modules() if name.endswith("proj")]
    assert projections and all(module.int4_weight is not None for module in projections)
    prompt = torch.randint(0, TINY["vocab_size"], (INT4_MAX_TOKENS,))
    torch.testing.assert_close(run(model, [prompt]), run(reference, [prompt]), atol=0.05, rtol=0)


def test_int4_needs_a_4bit_gguf_and_bfloat16(tmp_path: Path) -> None:
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_path, save_tiny_checkpoint(tmp_path, "llama"))
    with pytest.raises(ValueError, match="quantization 'gguf' needs"):
        load_model(gguf_path, dtype=torch.bfloat16, quantization="gguf")
    model = load_model(gguf_path, dtype=torch.bfloat16, quantization="auto")
    assert model.model.layers[0].mlp.down_proj.int4_weight is None


def test_auto_dtype_is_bfloat16_for_4bit_weights_else_the_checkpoints(tmp_path: Path) -> None:
    hf_model = save_tiny_checkpoint(tmp_path, "llama")
    assert load_model(tmp_path, dtype=None).lm_head_weight.dtype == torch.float32
    gguf_path = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_path, hf_model, gguf.GGMLQuantizationType.Q4_1)
    model = load_model(gguf_path, dtype=None, quantization="auto")
    assert model.lm_head_weight.dtype == torch.bfloat16
    down_proj = model.model.layers[0].mlp.down_proj
    # NOTE: the file's blocks run: by int4_q8 alone where the C++ kernels run, else by torch's int4.
    assert down_proj.forms is not None and ("int4_q8" in down_proj.forms.runs or down_proj.int4_weight is not None)


@pytest.mark.real_model
def test_default_model_matches_hugging_face_gguf_loader(
    default_model_path: Path, hf_reference_model: transformers.PreTrainedModel
) -> None:
    model = load_model(default_model_path, dtype="float32", quantization="none")
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert config.tie_word_embeddings and config.rope_theta == 100000.0
    hf_model = hf_reference_model
    prompt = torch.tensor(
        [
            1,
            9690,
            198,
            2683,
            359,
            253,
            5356,
            5646,
            11173,
            3365,
            3511,
            308,
            34519,
            28,
            7018,
            411,
            407,
            19712,
            8182,
            2,
        ]
    )
    with torch.no_grad():
        expected = hf_model(prompt[None]).logits[0, -1]
    logits = run(model, [prompt])[-1]
    torch.testing.assert_close(logits, expected, atol=1e-3, rtol=0)
    assert logits.argmax() == expected.argmax()
