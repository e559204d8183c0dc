"""Load a GGUF file: config from its metadata, tensors under Hugging Face names, read one at a time
(dequantized to float32, or as the blocks the file holds)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from engine_proc.cpu.weight_blocks import Blocks, BlocksReader, Q8Blocks
from engine_proc.loader.gguf_blocks import BLOCK_TYPES
from engine_proc.models.config import ModelConfig
from engine_proc.models.family import Family
from engine_proc.models.registry import family_of, gguf_family
from engine_proc.models.rope import inverse_frequencies, yarn_mscale
from proto.gguf_header import GGUFHeader, read_gguf_header
from proto.model_support import GGML_TYPES, GGUF_ARCHITECTURES

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
    # NOTE: a mixture-of-experts layer's router and its experts, all of them in one tensor (`*`: the expert)
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.experts.*.gate_proj",
    "ffn_up_exps": "mlp.experts.*.up_proj",
    "ffn_down_exps": "mlp.experts.*.down_proj",
    # NOTE: a shared expert (Qwen2-MoE's) and its gate
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
}
# NOTE: llama.cpp stores Llama 3.x rope scaling as per-frequency divisors in this tensor.
_ROPE_FREQS = "rope_freqs.weight"


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One tensor of the file: its ggml type, GGUF shape (innermost first) and where its bytes lie
    (quantized: one row of blocks per outer index; float: the values, outermost first)."""

    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]
    offset: int
    num_rows: int
    row_bytes: int


def _tensors(header: GGUFHeader) -> list[_Tensor]:
    """The file's tensors (a 3-D one, a layer's experts, as it is: see `_experts`)."""
    tensors = []
    for info in header.tensors:
        if info.ggml_type not in GGML_TYPES:
            known = ", ".join(sorted(known_type.name for known_type in GGML_TYPES))
            raise ValueError(f"tensor {info.name!r} has ggml type {info.ggml_type}, not supported; supported: {known}")
        tensor_type = GGMLQuantizationType(info.ggml_type)
        block_size, block_bytes = GGML_QUANT_SIZES[tensor_type]
        num_rows = math.prod(info.shape[1:])
        tensors.append(_Tensor(info.name, tensor_type, info.shape, info.offset, num_rows, info.shape[0] // block_size * block_bytes))
    return tensors


class GGUFWeights:
    """A GGUF file's tensors under Hugging Face names, each read from the file when asked for: a
    model is built one tensor at a time, never holding a float32 copy of the whole file."""

    def __init__(self, path: str | Path, header: GGUFHeader, config: ModelConfig) -> None:
        self.path = Path(path)
        family = family_of(config.architecture)
        num_heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
        self._tensors = {
            name: tensor
            for whole in _tensors(header) if whole.name != _ROPE_FREQS
            for name, tensor in _experts(_hf_name(whole.name, family), whole)
        }
        self._permuted_heads = {
            name: num_heads[name.split(".")[-2]]
            for name in self._tensors if family.is_gguf_permuted and name.split(".")[-2] in num_heads
        }

    def names(self) -> set[str]:
        return set(self._tensors)

    def is_quantized(self) -> bool:
        """Whether the file's matrices come as quantized blocks (not float32, float16 or bfloat16)."""
        return any(t.tensor_type not in _UNQUANTIZED for t in self._tensors.values() if len(t.shape) > 1)

    def float(self, name: str, rows: slice = slice(None)) -> torch.Tensor:
        """The tensor (its outermost `rows` only, where its rows are not permuted) dequantized to float32,
        in Hugging Face's row order."""
        tensor = self._tensors[name]
        if name in self._permuted_heads or len(tensor.shape) == 1:
            rows = slice(None)
        start, stop, _ = rows.indices(tensor.num_rows)
        array = dequantize(_read(self.path, tensor, start, stop), tensor.tensor_type)
        array = array.reshape(_numpy_shape(tensor, stop - start))
        return torch.from_numpy(np.ascontiguousarray(self._unpermuted(name, array), dtype=np.float32))

    def row_reader(self, name: str) -> Callable[[np.ndarray], torch.Tensor] | None:
        """A function that gives the float32 values of the tensor's rows `ids`, read through a mapping of
        the file, so only the pages of rows asked for ever become resident (an embedding table); None
        for a tensor whose rows are permuted."""
        tensor = self._tensors[name]
        if name in self._permuted_heads or len(tensor.shape) != 2:
            return None
        mapped = np.memmap(self.path, dtype=np.uint8, mode="r", offset=tensor.offset, shape=(tensor.num_rows, tensor.row_bytes))
        float_type = _FLOAT_TYPES.get(tensor.tensor_type)

        def rows(ids: np.ndarray) -> torch.Tensor:
            data = mapped[ids]
            values = data.view(float_type) if float_type is not None else dequantize(data, tensor.tensor_type)
            return torch.from_numpy(values.reshape(len(ids), -1).astype(np.float32, copy=False))

        return rows

    def blocks(self, name: str, rows: slice = slice(None)) -> Blocks | None:
        """The tensor's blocks (see weight_blocks), its outermost `rows` only where its rows are not
        permuted, in Hugging Face's row order: as the file holds them for Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
        Q5_K, Q6_K, IQ4_XS, MXFP4 and Q8_0; for the other quantized types (IQ4_NL, Q2_K, Q3_K, NVFP4, ...:
        no kernel form of their own yet) their
        values rounded to Q8_0, whose 8 bits a weight with a scale per 32 are finer than theirs; None for
        float tensors."""
        tensor = self._tensors[name]
        block_type = BLOCK_TYPES.get(tensor.tensor_type)
        if block_type is None and tensor.tensor_type not in _UNQUANTIZED and len(tensor.shape) == 2 and tensor.shape[0] % 32 == 0:
            return Q8Blocks.quantize(self.float(name, rows))
        if block_type is None:
            return None
        if name in self._permuted_heads:
            rows = slice(None)
        start, stop, _ = rows.indices(tensor.num_rows)
        return block_type.blocks(_read(self.path, tensor, start, stop), lambda array: self._unpermuted(name, array))

    def blocks_reader(self, name: str) -> BlocksReader | None:
        """The tensor's blocks read some rows at a time; None for types other than blocks'."""
        tensor = self._tensors[name]
        block_type = BLOCK_TYPES.get(tensor.tensor_type)
        kind = block_type.kind if block_type is not None else None if tensor.tensor_type in _UNQUANTIZED else Q8Blocks
        if kind is None or name in self._permuted_heads or len(tensor.shape) != 2 or tensor.shape[0] % 32:
            return None

        def read(rows: slice) -> Blocks:
            blocks = self.blocks(name, rows)
            assert blocks is not None
            return blocks

        return BlocksReader(kind, tensor.num_rows, read)

    def _unpermuted(self, name: str, array: np.ndarray) -> np.ndarray:
        heads = self._permuted_heads.get(name)
        return array if heads is None else _unpermute(array, heads)


_FLOAT_TYPES = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16}
_UNQUANTIZED = {*_FLOAT_TYPES, GGMLQuantizationType.BF16}


def _numpy_shape(tensor: _Tensor, num_rows: int) -> tuple[int, ...]:
    """The shape, outermost first, of `num_rows` of the tensor's outermost rows (a vector: all of it)."""
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return shape if len(shape) == 1 else (num_rows, *shape[1:])


def _read(path: Path, tensor: _Tensor, start: int = 0, stop: int | None = None) -> np.ndarray:
    """A tensor's bytes [rows, row bytes] (its rows `start` to `stop`; float types: their values), read
    into memory of their own, not a mapping of the file, whose pages would stay resident in this process."""
    stop = tensor.num_rows if stop is None else stop
    data = np.fromfile(
        path, dtype=np.uint8, count=(stop - start) * tensor.row_bytes, offset=tensor.offset + start * tensor.row_bytes
    ).reshape(stop - start, tensor.row_bytes)
    if tensor.tensor_type in _FLOAT_TYPES:
        return data.view(_FLOAT_TYPES[tensor.tensor_type]).reshape(_numpy_shape(tensor, stop - start))
    return data


def load_gguf_config(path: str | Path) -> ModelConfig:
    """Read the model config from a GGUF file's metadata (no dequantization)."""
    header = read_gguf_header(path)
    return _config_from_header(Path(path), header, _tensors(header))


def load_gguf(path: str | Path) -> tuple[ModelConfig, GGUFWeights]:
    """The model config and the file's tensors, to be read one at a time."""
    header = read_gguf_header(path)
    config = _config_from_header(Path(path), header, _tensors(header))
    return config, GGUFWeights(path, header, config)


def _hf_name(gguf_name: str, family: Family) -> str:
    """The model's name of a GGUF tensor (a layer's experts: with `*` for the expert)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    layer_names = {**_LAYER_NAMES, **family.gguf_layer_names}
    is_layer = len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit()
    # NOTE: a family's name for a whole tensor (gpt-oss's `attn_sinks.weight`: a parameter of its own)
    if is_layer and f"{parts[2]}.{parts[3]}" in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[f'{parts[2]}.{parts[3]}']}"
    if is_layer and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    # NOTE: older Mixtral files hold each expert on its own: `blk.N.ffn_gate.E.weight`.
    if len(parts) == 5 and parts[0] == "blk" and parts[2] in ("ffn_gate", "ffn_up", "ffn_down") and parts[3].isdigit():
        return f"model.layers.{parts[1]}.mlp.experts.{parts[3]}.{layer_names[parts[2]].split('.')[-1]}.{parts[4]}"
    raise ValueError(f"unsupported GGUF tensor {gguf_name!r}")


def _experts(name: str, tensor: _Tensor) -> list[tuple[str, _Tensor]]:
    """A tensor under its name; a layer's experts (GGUF shape [inputs, outputs, experts], or [outputs, experts]
    for their biases, named with `*`) as one tensor an expert, each its own stretch of the file's rows."""
    if "*" not in name:
        return [(name, tensor)]
    *shape, num_experts = tensor.shape
    num_rows = tensor.num_rows // num_experts
    return [
        (
            name.replace("*", str(expert)),
            dataclasses.replace(
                tensor, shape=tuple(shape), offset=tensor.offset + expert * num_rows * tensor.row_bytes, num_rows=num_rows,
            ),
        )
        for expert in range(num_experts)
    ]


def _unpermute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of Q/K rows (pairs interleaved -> halves)."""
    rows_per_half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, rows_per_half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _config_from_header(path: Path, header: GGUFHeader, tensors: list[_Tensor]) -> ModelConfig:
    """The config of the file's family: the fields every family reads alike, then its own (Family.gguf_config)."""
    metadata = header.metadata
    arch = _metadata(metadata, "general.architecture")
    tensor_names = {tensor.name for tensor in tensors}
    has_experts = bool(metadata.get(f"{arch}.expert_count")) or any("_exps." in name for name in tensor_names)
    family = gguf_family(arch, has_experts)
    if family is None:
        raise ValueError(f"unsupported GGUF architecture {arch!r}; supported: {', '.join(GGUF_ARCHITECTURES)}")

    def read(key: str, default: Any = _REQUIRED) -> Any:
        return _metadata(metadata, f"{arch}.{key}", default)

    hidden_size = int(read("embedding_length"))
    num_heads = int(read("attention.head_count"))
    head_dim = int(read("attention.key_length", hidden_size // num_heads))
    rotary_dim = int(read("rope.dimension_count", head_dim))
    if rotary_dim != head_dim:
        raise ValueError(f"partial rotary embeddings ({rotary_dim} of {head_dim} dims) are not supported")
    eos_token_ids = tuple(
        int(token_id)
        for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
        if (token_id := _metadata(metadata, key, None)) is not None
    )
    bos_token_id = _metadata(metadata, "tokenizer.ggml.bos_token_id", None)
    fields = dict(
        vocab_size=_vocab_size(metadata),
        hidden_size=hidden_size,
        intermediate_size=int(read("feed_forward_length")),
        num_hidden_layers=int(read("block_count")),
        num_attention_heads=num_heads,
        num_key_value_heads=int(read("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rms_norm_eps=float(read("attention.layer_norm_rms_epsilon")),
        rope_theta=float(read("rope.freq_base", 10000.0)),
        max_position_embeddings=int(read("context_length")),
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        eos_token_ids=tuple(dict.fromkeys(eos_token_ids)),
        bos_token_id=None if bos_token_id is None else int(bos_token_id),
        rope_scaling=_rope_scaling(read),
    )
    config = ModelConfig(architecture=family.architecture, **family.gguf_config(read, fields))
    if _ROPE_FREQS in tensor_names:
        config = _with_llama3_rope_scaling(path, read, tensors, config)
    return config


def _rope_scaling(read: Callable[..., Any]) -> tuple[tuple[str, float | str], ...] | None:
    """Linear rope scaling (positions divided by `factor`) or YaRN's, as llama.cpp reads them for every
    architecture; None for none (proto/model_support.py refuses the types not read here)."""
    rope_type = read("rope.scaling.type", None)
    if rope_type not in ("linear", "yarn"):
        return None
    factor = float(read("rope.scaling.factor"))
    if rope_type == "linear":
        return (("factor", factor), ("rope_type", "linear"))
    # NOTE: llama.cpp's YaRN: its ramp's ends rounded out (truncated), an attention factor of 0.1 ln(factor) + 1
    # times the file's `attn_factor`.
    scaling: dict[str, float | str] = {
        "rope_type": "yarn", "factor": factor,
        "original_max_position_embeddings": float(read("rope.scaling.original_context_length")),
        "beta_fast": float(read("rope.scaling.yarn_beta_fast", 32.0)),
        "beta_slow": float(read("rope.scaling.yarn_beta_slow", 1.0)),
        "truncate": True, "attention_factor": yarn_mscale(factor) * float(read("rope.scaling.attn_factor", 1.0)),
    }
    return tuple(sorted(scaling.items()))


def _with_llama3_rope_scaling(
    path: Path, read: Callable[..., Any], tensors: list[_Tensor], config: ModelConfig
) -> ModelConfig:
    """Recover llama3 rope scaling parameters from the frequency divisors llama.cpp stores.

    The divisors are `factor` for long wavelengths, 1 for short ones and a smooth blend between;
    `factor` is their maximum, and the other parameters are Llama 3.x's, checked against the table.
    """
    tensor = next(tensor for tensor in tensors if tensor.name == _ROPE_FREQS)
    divisors = torch.from_numpy(np.array(dequantize(_read(path, tensor), tensor.tensor_type), dtype=np.float32)).flatten()
    factor = float(divisors.max())
    if factor == 1.0:
        return config
    original = int(read("rope.scaling.original_context_length", 8192))
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
