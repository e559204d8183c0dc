"""Load a GGUF file: config from its metadata, tensors dequantized to float32 under Hugging Face names."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from tqdm import tqdm

from engine_proc.models.config import ModelConfig
from engine_proc.models.llama import inverse_frequencies
from engine_proc.models.weight_blocks import Q4Blocks
from proto.gguf_header import GGUFHeader, read_gguf_header

_ARCHITECTURES = ("llama", "qwen2", "qwen3")
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# NOTE: llama.cpp stores Llama 3.x rope scaling as per-frequency divisors in this tensor.
_ROPE_FREQS = "rope_freqs.weight"


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One tensor of the file: its ggml type, GGUF shape (innermost first) and bytes, memory-mapped
    (quantized: one row of blocks per outer index; float: the values, outermost first)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


def _tensors(path: str | Path, header: GGUFHeader) -> list[_Tensor]:
    blob = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for info in header.tensors:
        tensor_type = GGMLQuantizationType(info.ggml_type)
        block_size, block_bytes = GGML_QUANT_SIZES[tensor_type]
        num_rows = math.prod(info.shape[1:])
        row_bytes = info.shape[0] // block_size * block_bytes
        data = blob[info.offset : info.offset + num_rows * row_bytes].reshape(num_rows, row_bytes)
        if tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            data = data.view(np.float32 if tensor_type == GGMLQuantizationType.F32 else np.float16)
            data = data.reshape(tuple(reversed(info.shape)))
        tensors.append(_Tensor(info.name, tensor_type, info.shape, data))
    return tensors


def load_gguf_config(path: str | Path) -> ModelConfig:
    """Read the model config from a GGUF file's metadata (no dequantization)."""
    header = read_gguf_header(path)
    return _config_from_header(header, _tensors(path, header))


def load_gguf(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor], dict[str, Q4Blocks]]:
    """Config, float32 tensors and the 4-bit blocks of the Q4_0/Q4_1 ones, named as in Hugging Face checkpoints."""
    header = read_gguf_header(path)
    tensors = _tensors(path, header)
    config = _config_from_header(header, tensors)
    # NOTE: convert_hf_to_gguf.py permutes Q/K rows of llama-architecture models only.
    is_permuted = header.metadata["general.architecture"] == "llama"
    num_heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    weights: dict[str, torch.Tensor] = {}
    int4_blocks: dict[str, Q4Blocks] = {}
    for tensor in tqdm(tensors, desc=f"Loading {Path(path).name}", unit="tensor"):
        if tensor.name == _ROPE_FREQS:
            continue
        name = _hf_name(tensor.name)
        permuted_heads = num_heads.get(name.split(".")[-2]) if is_permuted else None
        if tensor.tensor_type in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1):
            arrays = _q4_arrays(tensor)
            if permuted_heads is not None:
                arrays = tuple(_unpermute(array, permuted_heads) for array in arrays)
            blocks = Q4Blocks(*(torch.from_numpy(np.ascontiguousarray(array)) for array in arrays))
            int4_blocks[name] = blocks
            weights[name] = blocks.dequantize()
            continue
        array = dequantize(tensor.data, tensor.tensor_type)
        array = array.reshape(tuple(int(dim) for dim in reversed(tensor.shape)))
        if permuted_heads is not None:
            array = _unpermute(array, permuted_heads)
        weights[name] = _to_tensor(array)
    return config, weights, int4_blocks


def _q4_arrays(tensor: _Tensor) -> tuple[np.ndarray, ...]:
    """(codes, scales, mins) of a Q4_0/Q4_1 tensor: w = code * scale + min per block of 32.

    A block is a float16 scale (Q4_1: then a float16 min) and 16 bytes of codes, element j in
    the low nibble of byte j and element j + 16 in the high nibble.
    """
    num_rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
    has_min = tensor.tensor_type == GGMLQuantizationType.Q4_1
    header = 4 if has_min else 2
    raw = np.asarray(tensor.data).reshape(num_rows, -1, header + 16)
    scales = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    mins = raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if has_min else -8 * scales
    packed = raw[..., header:]
    codes = np.concatenate((packed & 0x0F, packed >> 4), axis=-1).reshape(num_rows, -1)
    return codes, scales, mins


def _hf_name(gguf_name: str) -> str:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES and parts[1].isdigit():
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ValueError(f"unsupported GGUF tensor {gguf_name!r}")


def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of Q/K rows (pairs interleaved -> halves)."""
    rows_per_half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, rows_per_half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _to_tensor(array: np.ndarray) -> torch.Tensor:
    # NOTE: unquantized tensors come back as read-only views of the memory-mapped file.
    if not array.flags.writeable or not array.flags.c_contiguous:
        array = np.array(array, dtype=np.float32, order="C")
    return torch.from_numpy(array.astype(np.float32, copy=False))


def _config_from_header(header: GGUFHeader, tensors: list[_Tensor]) -> ModelConfig:
    metadata = header.metadata
    arch = _metadata(metadata, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(_ARCHITECTURES)}")
    hidden_size = int(_metadata(metadata, f"{arch}.embedding_length"))
    num_heads = int(_metadata(metadata, f"{arch}.attention.head_count"))
    head_dim = int(_metadata(metadata, f"{arch}.attention.key_length", hidden_size // num_heads))
    rotary_dim = int(_metadata(metadata, f"{arch}.rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise ValueError(f"partial rotary embeddings ({rotary_dim} of {head_dim} dims) are not supported")
    eos_token_ids = tuple(
        int(token_id)
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
        if (token_id := _metadata(metadata, key, None)) is not None
    )
    bos_token_id = _metadata(metadata, "tokenizer.ggml.bos_token_id", None)
    tensor_names = {tensor.name for tensor in tensors}
    config = ModelConfig(
        architecture=arch,
        vocab_size=_vocab_size(metadata),
        hidden_size=hidden_size,
        intermediate_size=int(_metadata(metadata, f"{arch}.feed_forward_length")),
        num_hidden_layers=int(_metadata(metadata, f"{arch}.block_count")),
        num_attention_heads=num_heads,
        num_key_value_heads=int(_metadata(metadata, f"{arch}.attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(_metadata(metadata, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_theta=float(_metadata(metadata, f"{arch}.rope.freq_base", 10000.0)),
        max_position_embeddings=int(_metadata(metadata, f"{arch}.context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        eos_token_ids=tuple(dict.fromkeys(eos_token_ids)),
        bos_token_id=None if bos_token_id is None else int(bos_token_id),
    )
    if _ROPE_FREQS in tensor_names:
        config = _with_llama3_rope_scaling(metadata, tensors, config)
    return config


def _with_llama3_rope_scaling(metadata: dict[str, Any], tensors: list[_Tensor], config: ModelConfig) -> ModelConfig:
    """Recover llama3 rope scaling parameters from the frequency divisors llama.cpp stores.

    The divisors are `factor` for long wavelengths, 1 for short ones and a smooth blend between;
    `factor` is their maximum, and the other parameters are Llama 3.x's, checked against the table.
    """
    tensor = next(tensor for tensor in tensors if tensor.name == _ROPE_FREQS)
    divisors = torch.from_numpy(
        np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    ).flatten()
    factor = float(divisors.max())
    if factor == 1.0:
        return config
    original = int(_metadata(metadata, f"{config.architecture}.rope.scaling.original_context_length", 8192))
    scaling: tuple[tuple[str, float | str], ...] = (
        ("factor", factor),
        ("high_freq_factor", 4.0),
        ("low_freq_factor", 1.0),
        ("original_max_position_embeddings", float(original)),
        ("rope_type", "llama3"),
    )
    scaled = dataclasses.replace(config, rope_scaling=scaling)
    expected = inverse_frequencies(config) / inverse_frequencies(scaled)
    if expected.shape != divisors.shape or not torch.allclose(expected, divisors, rtol=1e-3):
        raise ValueError(
            f"{_ROPE_FREQS} does not match llama3 rope scaling; this rope scaling is not supported"
        )
    return scaled


def _vocab_size(metadata: dict[str, Any]) -> int:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise ValueError("GGUF metadata lacks 'tokenizer.ggml.tokens'")
    return len(tokens)


_REQUIRED = object()


def _metadata(metadata: dict[str, Any], key: str, default: Any = _REQUIRED) -> Any:
    value = metadata.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return default
    return value
