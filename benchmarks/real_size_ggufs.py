"""GGUF files of real model shapes with random weights, for measuring memory and speed at real sizes.

    .venv/bin/python -m benchmarks.real_size_ggufs --shape llama-3.2-1b --type Q4_0 --out /tmp/1b-q4_0.gguf
    .venv/bin/python -m benchmarks.real_size_ggufs --shape llama-3.1-8b --type Q8_0 --out /tmp/8b-q8_0.gguf
    .venv/bin/python -m benchmarks.real_size_ggufs --shape gpt-oss-20b --type MXFP4_MOE --out /tmp/20b-mxfp4.gguf

The default model's tokenizer (SmolLM2's 49,152-token vocabulary, its chat template) goes in each
file, so every server and `zeroserve bench serve` can use it. Weights are normal with the spread of
a trained model's (0.02; norms 1), quantized by gguf-py as llama.cpp's converter would, tensor by
tensor and written as they come, so a file of 8B parameters needs about its own size in memory.
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K and IQ4_XS (every matrix; the k- and i-quants by a
plain quantizer) come out directly, and so does MXFP4_MOE (llama-quantize's mix for gpt-oss: every
expert MXFP4, every other matrix Q8_0); a k-quant mix (Q4_K_M, Q5_K_M) is made from a Q8_0
file by llama.cpp's `llama-quantize --allow-requantize` (`--llama-quantize`, built by
../shared/tools/build-llama-cpp), as users' files are made from their originals (a mixture of
experts' Q4_K_M is written directly: a 30B model's Q8_0 source would be 32 GB).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from proto.gguf_header import read_gguf_metadata
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model

LLAMA_QUANTIZE = Path.home() / ".cache/zeroserve-peer/llama.cpp-native/bin/llama-quantize"
DIRECT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "F16")
DIRECT_MIXES = ("MXFP4_MOE",)
REQUANTIZED_TYPES = ("Q4_K_M", "Q5_K_M")


@dataclass(frozen=True)
class Shape:
    """A decoder's shape (the vocabulary is always the default model's)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    is_tied: bool
    has_qkv_bias: bool = False
    architecture: str = "llama"
    rope_theta: float = 500000.0
    has_qk_norm: bool = False
    # NOTE: mixture-of-experts layers where `num_experts` > 0 (each layer's feed-forward is then its experts)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    expert_intermediate_size: int = 0
    # NOTE: where > 0, every other layer (the first of each two) attends over this many tokens alone
    sliding_window: int = 0
    yarn: tuple[float, int] | None = None  # YaRN rotary scaling: (factor, original context length)


SHAPES = {
    "llama-3.2-1b": Shape(2048, 16, 8192, 32, 8, 64, is_tied=True),
    "qwen2.5-3b": Shape(2048, 36, 11008, 16, 2, 128, is_tied=True, has_qkv_bias=True, architecture="qwen2", rope_theta=1e6),
    "llama-3.1-8b": Shape(4096, 32, 14336, 32, 8, 128, is_tied=False),
    "qwen3-30b-a3b": Shape(
        2048, 48, 6144, 32, 4, 128, is_tied=False, architecture="qwen3moe", rope_theta=1e6, has_qk_norm=True,
        num_experts=128, num_experts_per_tok=8, expert_intermediate_size=768,
    ),
    # NOTE: gpt-oss's own layer (gpt_oss_layer). Its vocabulary (201,088) and harmony template are the default
    # model's here, as every shape's: MXFP4_MOE's 11.2 GB, not the real file's 12.1 (embedding and head smaller).
    "gpt-oss-20b": Shape(
        2880, 24, 2880, 64, 8, 64, is_tied=False, has_qkv_bias=True, architecture="gpt-oss", rope_theta=150000.0,
        num_experts=32, num_experts_per_tok=4, expert_intermediate_size=2880, sliding_window=128, yarn=(32.0, 4096),
    ),
}


def quantize_q4_k(values: np.ndarray, bits: int = 4) -> np.ndarray:
    """`values` [rows, cols] (cols a multiple of 256) as GGUF Q4_K bytes [rows, cols / 256 * 144] (bits=5:
    Q5_K, [rows, cols / 256 * 176]; gguf-py reads but does not write them): per group of 32 a scale and a
    minimum from its range, as 6-bit multiples of the super-block's float16 d and dmin (a plain quantizer:
    llama.cpp's searches for better scales; the layout is the same)."""
    rows, cols = values.shape
    top = 2**bits - 1
    groups = values.reshape(rows, cols // 256, 8, 32).astype(np.float32)
    low = np.minimum(groups.min(axis=-1), 0.0)
    ranges = np.maximum(groups.max(axis=-1) - low, 1e-12)
    d = (ranges.max(axis=-1) / top / 63).astype(np.float16)
    dmin = (-low.min(axis=-1) / 63).astype(np.float16)
    scales = np.clip(np.rint(ranges / top / np.maximum(d.astype(np.float32), 1e-20)[..., None]), 1, 63).astype(np.uint8)
    mins = np.clip(np.rint(-low / np.maximum(dmin.astype(np.float32), 1e-20)[..., None]), 0, 63).astype(np.uint8)
    step = (d.astype(np.float32)[..., None] * scales)[..., None]
    offset = (dmin.astype(np.float32)[..., None] * mins)[..., None]
    codes = np.clip(np.rint((groups + offset) / step), 0, top).astype(np.uint8)
    packed = np.empty((rows, cols // 256, 144 if bits == 4 else 176), np.uint8)
    packed[..., 0:2] = d[..., None].view(np.uint8)
    packed[..., 2:4] = dmin[..., None].view(np.uint8)
    packed[..., 4:8] = (scales[..., :4] & 63) | ((scales[..., 4:] >> 4) << 6)
    packed[..., 8:12] = (mins[..., :4] & 63) | ((mins[..., 4:] >> 4) << 6)
    packed[..., 12:16] = (scales[..., 4:] & 0xF) | ((mins[..., 4:] & 0xF) << 4)
    if bits == 5:  # group g's fifth bits at bit g of bytes 16..47
        packed[..., 16:48] = sum(((codes[..., g, :] >> 4) << g) for g in range(8)).astype(np.uint8)
    pairs = (codes & 0x0F).reshape(rows, cols // 256, 4, 2, 32)
    packed[..., -128:] = (pairs[..., 0, :] | (pairs[..., 1, :] << 4)).reshape(rows, cols // 256, 128)
    return packed.reshape(rows, -1)


def quantize_q6_k(values: np.ndarray) -> np.ndarray:
    """`values` [rows, cols] (cols a multiple of 256) as GGUF Q6_K bytes [rows, cols / 256 * 210] (gguf-py
    reads but does not write them): per sub-block of 16 a scale from its largest magnitude, as a signed
    8-bit multiple of the super-block's float16 d, codes q − 32 in −32..31 (a plain quantizer)."""
    rows, cols = values.shape
    sub_blocks = values.reshape(rows, cols // 256, 16, 16).astype(np.float32)
    steps = np.abs(sub_blocks).max(axis=-1) / 31
    d = (steps.max(axis=-1) / 127).astype(np.float16)
    scales = np.clip(np.rint(steps / np.maximum(d.astype(np.float32), 1e-20)[..., None]), 1, 127).astype(np.int8)
    step = (d.astype(np.float32)[..., None] * scales)[..., None]
    codes = (np.clip(np.rint(sub_blocks / np.maximum(step, 1e-20)), -32, 31) + 32).astype(np.uint8)
    quarters = codes.reshape(rows, cols // 256, 2, 4, 32)  # per half of 128: quarters of 32
    packed = np.empty((rows, cols // 256, 210), np.uint8)
    low = packed[..., 0:128].reshape(rows, cols // 256, 2, 2, 32)
    low[...] = (quarters[..., 0:2, :] & 0x0F) | ((quarters[..., 2:4, :] & 0x0F) << 4)
    packed[..., 128:192] = sum(
        (quarters[..., j, :] >> 4) << (2 * j) for j in range(4)
    ).astype(np.uint8).reshape(rows, cols // 256, 64)
    packed[..., 192:208] = scales.view(np.uint8)
    packed[..., 208:210] = d[..., None].view(np.uint8)
    return packed.reshape(rows, -1)


def quantize_iq4_xs(values: np.ndarray) -> np.ndarray:
    """`values` [rows, cols] (cols a multiple of 256) as GGUF IQ4_XS bytes [rows, cols / 256 * 136] (gguf-py
    reads but does not write them): per group of 32 a scale from its largest magnitude, as a signed
    6-bit multiple of the super-block's float16 d, each value's nearest of the 16 table values (a
    plain quantizer: llama.cpp's searches for better scales; the layout is the same)."""
    table = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
    rows, cols = values.shape
    groups = values.reshape(rows, cols // 256, 8, 32).astype(np.float32)
    steps = np.abs(groups).max(axis=-1) / 127
    d = (steps.max(axis=-1) / 31).astype(np.float16)
    scales = np.clip(np.rint(steps / np.maximum(d.astype(np.float32), 1e-20)[..., None]), 1, 31).astype(np.int8)
    step = np.maximum(d.astype(np.float32)[..., None] * scales, 1e-20)[..., None]
    codes = np.abs((groups / step)[..., None] - table).argmin(axis=-1).astype(np.uint8)
    biased = (scales.astype(np.int16) + 32).astype(np.uint16)
    packed = np.empty((rows, cols // 256, 136), np.uint8)
    packed[..., 0:2] = d[..., None].view(np.uint8)
    packed[..., 2:4] = sum((biased[..., g] >> 4) << (2 * g) for g in range(8)).astype(np.uint16)[..., None].view(np.uint8)
    packed[..., 4:8] = ((biased[..., 0::2] & 0x0F) | ((biased[..., 1::2] & 0x0F) << 4)).astype(np.uint8)
    packed[..., 8:] = (codes[..., :16] | (codes[..., 16:] << 4)).reshape(rows, cols // 256, 128)
    return packed.reshape(rows, -1)


# NOTE: e2m1's values doubled (0, 0.5, 1, ... 6 as llama.cpp's kvalues_mxfp4 hold them): a magnitude's code is
# how many of the midpoints between them it exceeds, the lower of two at a tie (llama.cpp's best_index_mxfp4).
_E2M1_MIDPOINTS = (0.5, 1.5, 2.5, 3.5, 5.0, 7.0, 10.0)


def quantize_mxfp4(values: np.ndarray, rows_at_once: int = 256) -> np.ndarray:
    """`values` [rows, cols] (cols a multiple of 32) as GGUF MXFP4 bytes [rows, cols / 32 * 17]: per block of 32
    an e8m0 exponent byte e from its largest magnitude (floor(log2 max) + 125; the scale 2^(e − 128)), then 16
    bytes of e2m1 codes (sign in bit 3), value j in the low nibble of byte j and value j + 16 in its high one.
    The bytes of llama.cpp's quantize_row_mxfp4_ref and gguf-py's, some rows at a time and ~10× faster."""
    rows, cols = values.shape
    packed = np.empty((rows, cols // 32, 17), np.uint8)
    for start in range(0, rows, rows_at_once):
        blocks = values[start:start + rows_at_once].reshape(-1, cols // 32, 32).astype(np.float32, copy=False)
        magnitudes = np.abs(blocks)
        largest = magnitudes.max(axis=-1)
        exponents = np.where(largest > 0, np.frexp(largest)[1] + 124, 0).astype(np.uint8)
        # NOTE: halved (2^(127 − e), against halved midpoints): 2^(128 − e) overflows float32 at e = 0.
        halves = magnitudes * np.ldexp(np.float32(1), 127 - exponents.astype(np.int32))[..., None]
        codes = sum(((halves > mid / 2).view(np.uint8) for mid in _E2M1_MIDPOINTS), np.zeros_like(blocks, np.uint8))
        codes |= ((blocks < 0) & (codes > 0)).view(np.uint8) << 3
        packed[start:start + rows_at_once, :, 0] = exponents
        packed[start:start + rows_at_once, :, 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    return packed.reshape(rows, -1)


def tensors(shape: Shape, vocab_size: int) -> list[tuple[str, tuple[int, ...]]]:
    """Each tensor's GGUF name and numpy shape (outermost first), in llama.cpp's order."""
    names = [("token_embd.weight", (vocab_size, shape.hidden_size))]
    for layer in range(shape.num_layers):
        names += (gpt_oss_layer if shape.architecture == "gpt-oss" else layer_tensors)(shape, f"blk.{layer}")
    names.append(("output_norm.weight", (shape.hidden_size,)))
    if not shape.is_tied:
        names.append(("output.weight", (vocab_size, shape.hidden_size)))
    return names


def layer_tensors(shape: Shape, block: str) -> list[tuple[str, tuple[int, ...]]]:
    """A Llama-family layer's tensors (`block`: `blk.N`), its feed-forward a mixture of experts where the shape
    has them."""
    q, kv = shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    names = [
        (f"{block}.attn_norm.weight", (shape.hidden_size,)),
        (f"{block}.attn_q.weight", (q, shape.hidden_size)),
        (f"{block}.attn_k.weight", (kv, shape.hidden_size)),
        (f"{block}.attn_v.weight", (kv, shape.hidden_size)),
    ]
    if shape.has_qkv_bias:
        names += [(f"{block}.attn_q.bias", (q,)), (f"{block}.attn_k.bias", (kv,)), (f"{block}.attn_v.bias", (kv,))]
    if shape.has_qk_norm:
        names += [(f"{block}.attn_q_norm.weight", (shape.head_dim,)), (f"{block}.attn_k_norm.weight", (shape.head_dim,))]
    names += [(f"{block}.attn_output.weight", (shape.hidden_size, q)), (f"{block}.ffn_norm.weight", (shape.hidden_size,))]
    if shape.num_experts:
        experts, width = shape.num_experts, shape.expert_intermediate_size
        return names + [
            (f"{block}.ffn_gate_inp.weight", (experts, shape.hidden_size)),
            (f"{block}.ffn_gate_exps.weight", (experts, width, shape.hidden_size)),
            (f"{block}.ffn_up_exps.weight", (experts, width, shape.hidden_size)),
            (f"{block}.ffn_down_exps.weight", (experts, shape.hidden_size, width)),
        ]
    return names + [
        (f"{block}.ffn_gate.weight", (shape.intermediate_size, shape.hidden_size)),
        (f"{block}.ffn_up.weight", (shape.intermediate_size, shape.hidden_size)),
        (f"{block}.ffn_down.weight", (shape.hidden_size, shape.intermediate_size)),
    ]


def gpt_oss_layer(shape: Shape, block: str) -> list[tuple[str, tuple[int, ...]]]:
    """A gpt-oss layer's tensors as llama.cpp's `gpt-oss` reads them: a bias on every attention projection,
    a sink logit per query head, the norm before the experts named `post_attention_norm`, and a bias on the
    router and on each expert's projections ([experts, outputs])."""
    hidden, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    experts, width = shape.num_experts, shape.expert_intermediate_size
    return [
        (f"{block}.attn_norm.weight", (hidden,)),
        (f"{block}.attn_q.weight", (q, hidden)), (f"{block}.attn_q.bias", (q,)),
        (f"{block}.attn_k.weight", (kv, hidden)), (f"{block}.attn_k.bias", (kv,)),
        (f"{block}.attn_v.weight", (kv, hidden)), (f"{block}.attn_v.bias", (kv,)),
        (f"{block}.attn_output.weight", (hidden, q)), (f"{block}.attn_output.bias", (hidden,)),
        (f"{block}.attn_sinks.weight", (shape.num_heads,)),
        (f"{block}.post_attention_norm.weight", (hidden,)),
        (f"{block}.ffn_gate_inp.weight", (experts, hidden)), (f"{block}.ffn_gate_inp.bias", (experts,)),
        (f"{block}.ffn_gate_exps.weight", (experts, width, hidden)), (f"{block}.ffn_gate_exps.bias", (experts, width)),
        (f"{block}.ffn_up_exps.weight", (experts, width, hidden)), (f"{block}.ffn_up_exps.bias", (experts, width)),
        (f"{block}.ffn_down_exps.weight", (experts, hidden, width)), (f"{block}.ffn_down_exps.bias", (experts, hidden)),
    ]


def is_float(name: str, dims: tuple[int, ...]) -> bool:
    """Whether a tensor stays float32 in every type: vectors, biases (an expert's too) and routers, as llama-quantize
    leaves them."""
    return len(dims) == 1 or name.endswith((".bias", "ffn_gate_inp.weight"))


def write(
    shape: Shape, ggml_type: str, out: Path, seed: int = 0, types: dict[str, str] | Callable[[str], str | None] | None = None
) -> None:
    """A GGUF of `shape` with random weights, matrices in `ggml_type` (norms, biases and routers float32), or in
    `types[kind]` for the matrices of a kind (`attn_v`, `ffn_down`, `token_embd`: a k-quant mix's own; or
    `types(name)`, a tensor's own or None). Each tensor is made from its own seed as it is written, so the
    file never needs to be in memory whole."""
    metadata = read_gguf_metadata(resolve_model(DEFAULT_MODEL).path)
    vocab_size = len(metadata["tokenizer.ggml.tokens"])
    arch = shape.architecture
    writer = gguf.GGUFWriter(out, arch)
    writer.add_block_count(shape.num_layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_vocab_size(vocab_size)
    if shape.num_experts:
        writer.add_expert_count(shape.num_experts)
        writer.add_expert_used_count(shape.num_experts_per_tok)
        writer.add_expert_feed_forward_length(shape.expert_intermediate_size)
    if shape.sliding_window:
        writer.add_sliding_window(shape.sliding_window)
    if shape.yarn is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(shape.yarn[0])
        writer.add_rope_scaling_orig_ctx_len(shape.yarn[1])
    writer.add_tokenizer_model(metadata["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(metadata["tokenizer.ggml.pre"])
    writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    writer.add_token_types(metadata["tokenizer.ggml.token_type"])
    writer.add_token_merges(metadata["tokenizer.ggml.merges"])
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id"):
        writer.add_uint32(f"tokenizer.ggml.{key}", int(metadata[f"tokenizer.ggml.{key}"]))
    writer.add_add_bos_token(bool(metadata.get("tokenizer.ggml.add_bos_token", False)))
    writer.add_chat_template(metadata["tokenizer.chat_template"])
    type_of = types if callable(types) else (lambda name: (types or {}).get(name.split(".")[-2]))

    def tensor(index: int, name: str, dims: tuple[int, ...]) -> tuple[np.ndarray, gguf.GGMLQuantizationType | None]:
        rng = np.random.default_rng((seed, index))
        if is_float(name, dims):
            values = np.ones(dims, np.float32) if name.endswith("norm.weight") else rng.normal(0, 0.02, dims).astype(np.float32)
            return values, None
        quant = gguf.GGMLQuantizationType[type_of(name) or ggml_type]
        values = rng.normal(0, 0.02, (int(np.prod(dims[:-1])), dims[-1])).astype(np.float32)
        return quantize(values, quant).reshape(*dims[:-1], -1), quant

    names = tensors(shape, vocab_size)
    for name, dims in names:
        if is_float(name, dims):
            writer.add_tensor_info(name, dims, np.dtype(np.float32), int(np.prod(dims)) * 4)
            continue
        quant = gguf.GGMLQuantizationType[type_of(name) or ggml_type]
        block_size, block_bytes = gguf.GGML_QUANT_SIZES[quant]
        row_bytes = dims[-1] // block_size * block_bytes
        # NOTE: with `raw_dtype` gguf-py takes the shape in bytes per row, as the quantized array has it.
        writer.add_tensor_info(name, (*dims[:-1], row_bytes), np.dtype(np.uint8), int(np.prod(dims[:-1])) * row_bytes, raw_dtype=quant)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for index, (name, dims) in enumerate(names):
        writer.write_tensor_data(tensor(index, name, dims)[0])
    writer.close()


def q4_k_m(num_layers: int) -> Callable[[str], str | None]:
    """llama.cpp's Q4_K_M mix (llama-quantize's rules for it): Q6_K for the output head and for the value and
    feed-forward-down matrices of the first and last eighth of the layers and every third between, Q4_K else."""

    def type_of(name: str) -> str | None:
        if name == "output.weight":
            return "Q6_K"
        parts = name.split(".")
        if parts[0] != "blk" or parts[2] not in ("attn_v", "ffn_down", "ffn_down_exps"):
            return "Q4_K"
        layer = int(parts[1])
        is_more = layer < num_layers // 8 or layer >= 7 * num_layers // 8 or (layer - num_layers // 8) % 3 == 2
        return "Q6_K" if is_more else "Q4_K"

    return type_of


def mxfp4_moe(name: str) -> str | None:
    """llama.cpp's MXFP4_MOE mix (llama-quantize's rule for it): MXFP4 for every layer's experts, the type
    asked for (Q8_0) else."""
    return "MXFP4" if "_exps." in name else None


def quantize(values: np.ndarray, quant: gguf.GGMLQuantizationType) -> np.ndarray:
    """`values` [rows, cols] as GGUF `quant` bytes: the k- and i-quants and MXFP4 by the quantizers above,
    the others by gguf-py."""
    if quant in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q5_K):
        return quantize_q4_k(values, bits=4 if quant == gguf.GGMLQuantizationType.Q4_K else 5)
    if quant == gguf.GGMLQuantizationType.Q6_K:
        return quantize_q6_k(values)
    if quant == gguf.GGMLQuantizationType.IQ4_XS:
        return quantize_iq4_xs(values)
    if quant == gguf.GGMLQuantizationType.MXFP4:
        return quantize_mxfp4(values)
    if quant == gguf.GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return np.asarray(gguf.quants.quantize(values, quant))


def requantize(
    source: Path, out: Path, type_of: Callable[[str], str | None], extra_tensors: dict[str, np.ndarray] | None = None
) -> None:
    """`source` (a GGUF) again, each tensor that `type_of(its name)` names a GGML type for (`"Q4_K"`, ...)
    dequantized and quantized to it, and `extra_tensors` (float32) added; its metadata and every other
    tensor as they were."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(out, str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            value_type = field.types[0]
            sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), value_type, sub_type)
    for tensor in reader.tensors:
        data, raw_type = tensor.data, tensor.tensor_type
        ggml_type = type_of(tensor.name)
        if ggml_type is not None:
            quant = gguf.GGMLQuantizationType[ggml_type]
            data, raw_type = quantize(gguf.quants.dequantize(data, raw_type), quant), quant
        writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=raw_type)
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--type", choices=[*DIRECT_TYPES, *DIRECT_MIXES, *REQUANTIZED_TYPES], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--llama-quantize", type=Path, default=LLAMA_QUANTIZE)
    parser.add_argument("--layers", type=int, help="this many of the shape's layers (a smaller file of the same widths)")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    if args.layers:
        shape = dataclasses.replace(shape, num_layers=args.layers)
    if args.type in DIRECT_TYPES:
        write(shape, args.type, args.out)
        return
    if args.type == "MXFP4_MOE":
        write(shape, "Q8_0", args.out, types=mxfp4_moe)
        return
    if shape.num_experts and args.type == "Q4_K_M":
        # NOTE: a 30B model's Q8_0 source would be 32 GB: its mix is written directly (plain quantizers).
        write(shape, "Q4_K", args.out, types=q4_k_m(shape.num_layers))
        return
    if not args.llama_quantize.exists():
        parser.error(f"no llama-quantize at {args.llama_quantize}: build it with ../shared/tools/build-llama-cpp")
    with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
        source = Path(tmp) / "q8_0.gguf"
        write(shape, "Q8_0", source)
        subprocess.run([str(args.llama_quantize), "--allow-requantize", str(source), str(args.out), args.type], check=True)


if __name__ == "__main__":
    main()
