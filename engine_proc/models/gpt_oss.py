"""gpt-oss (openai/gpt-oss-20b and -120b): the Llama decoder with biases on every attention projection, a sink
logit per query head, every other layer attending over a sliding window (128 tokens), YaRN rotary scaling,
and every layer's feed-forward a mixture of experts (32 or 128, 4 chosen).

What differs from the other mixtures (moe.py): the router has a bias, and takes each token's highest
logits first, its weights the softmax over those alone; each expert's projections have biases, and its
gate is a clamped SwiGLU: gate ≤ 7, −7 ≤ up ≤ 7, out = (up + 1) · gate · sigmoid(1.702 · gate).
A folder holds a layer's experts in one tensor, gate and up interleaved (columns ::2 and 1::2) in
`gate_up_proj` [experts, hidden, 2 × intermediate] and `down_proj` [experts, intermediate, hidden], or (the
real models) as MXFP4 in `*_blocks` and `*_scales` (gate and up rows interleaved): each expert's are split out
here as the Linear layers it runs (views, no copies; MXFP4 blocks, unpacked when the loader asks for them).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from engine_proc.cpu.quantized_linear import Linear
from engine_proc.cpu.weight_blocks import MXFP4Blocks
from engine_proc.models.config import ModelConfig
from engine_proc.models.family import Family, Fields, FolderTensor, MetadataReader
from engine_proc.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel, RMSNorm
from engine_proc.models.moe import SparseMoeBlock, gguf_expert_fields, hf_expert_fields

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0
# NOTE: llama.cpp's gpt-oss: every other layer slides (the first of each two) unless the file says.
_GGUF_PATTERN = 2


def clamped_swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """gpt-oss's gated activation, in transformers' order of operations."""
    gate = gate.clamp(max=SWIGLU_LIMIT)
    up = up.clamp(min=-SWIGLU_LIMIT, max=SWIGLU_LIMIT)
    return (up + 1) * (gate * torch.sigmoid(gate * SWIGLU_ALPHA))


class GptOssExpert(nn.Module):
    """One expert: gate and up projections fused, each with a bias, the clamped SwiGLU, the down projection."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=True)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=True)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(clamped_swiglu(gate, up))


class GptOssMoeBlock(SparseMoeBlock):
    """gpt-oss's experts and their router (with a bias; the softmax over the chosen logits)."""

    has_router_bias = True
    is_softmax_of_chosen = True
    is_clamped_swiglu = True

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config, lambda size: GptOssExpert(config.hidden_size, size))


class GptOssAttention(LlamaAttention):
    """The Llama attention with a bias on the output projection too, and a sink logit per query head."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        self.o_proj = Linear(config.q_size, config.hidden_size, bias=config.attention_bias)
        self.sinks = nn.Parameter(torch.empty(config.num_attention_heads))


class GptOssDecoderLayer(LlamaDecoderLayer):
    """The Llama layer (pre-norm attention, pre-norm feed-forward, residuals) with gpt-oss's attention and experts."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        nn.Module.__init__(self)  # NOTE: not the Llama layer's, which would build its own attention and MLP
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = GptOssAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = GptOssMoeBlock(config)


class GptOssModel(LlamaModel):
    """Embedding, gpt-oss's decoder layers and final norm."""

    layer_class = GptOssDecoderLayer


class GptOssForCausalLM(LlamaForCausalLM):
    """gpt-oss: its decoder, the Llama family's output head and matmul forms."""

    model_class = GptOssModel


def _hf_config(raw: Mapping[str, Any], fields: Fields) -> Fields:
    """gpt-oss's config.json: its experts, its sliding and full layers."""
    quantization = (raw.get("quantization_config") or {}).get("quant_method")
    if quantization not in (None, "mxfp4"):
        raise ValueError(f"gpt-oss's {quantization!r} quantization is not supported; supported: float weights, mxfp4")
    swiglu = (raw.get("swiglu_alpha", SWIGLU_ALPHA), raw.get("swiglu_limit", SWIGLU_LIMIT))
    if swiglu != (SWIGLU_ALPHA, SWIGLU_LIMIT):
        raise ValueError(f"gpt-oss's SwiGLU alpha and limit {swiglu} are not supported; supported: 1.702, 7.0")
    num_layers, window = raw["num_hidden_layers"], raw.get("sliding_window")
    layer_types = raw.get("layer_types") or [
        "sliding_attention" if i % _GGUF_PATTERN < _GGUF_PATTERN - 1 else "full_attention" for i in range(num_layers)
    ]
    sliding = tuple(kind == "sliding_attention" for kind in layer_types) if window else ()
    fields = {**fields, "attention_bias": bool(raw.get("attention_bias", True)), "sliding_window": window,
              "sliding_layers": sliding}
    return hf_expert_fields(raw, fields, is_renormalised=False)


def _gguf_config(read: MetadataReader, fields: Fields) -> Fields:
    """gpt-oss's GGUF metadata as llama.cpp reads it, but its YaRN ramp as gpt-oss's own: not truncated."""
    window = int(read("attention.sliding_window", 0))
    pattern = read("attention.sliding_window_pattern", _GGUF_PATTERN)
    if isinstance(pattern, list):
        sliding = tuple(bool(is_sliding) for is_sliding in pattern)
    else:
        sliding = tuple(i % int(pattern) < int(pattern) - 1 for i in range(fields["num_hidden_layers"]))
    # NOTE: llama.cpp rounds YaRN's ramp out to whole dims for every model; gpt-oss was trained without
    # (OpenAI's reference, and its config.json's `truncate: false`, which the GGUF does not keep).
    scaling = dict(fields["rope_scaling"] or {})
    if scaling.get("rope_type") == "yarn":
        fields = {**fields, "rope_scaling": tuple(sorted({**scaling, "truncate": False}.items()))}
    fields = {**fields, "sliding_window": window or None, "sliding_layers": sliding if window else ()}
    return gguf_expert_fields(read, fields, is_renormalised=False)


def _hf_tensors(tensors: dict[str, Tensor]) -> dict[str, FolderTensor]:
    """A folder's tensors as the model's: each layer's experts split one an expert, as its Linear layers hold them."""
    model_tensors: dict[str, FolderTensor] = {}
    for name, tensor in tensors.items():
        layer, _, kind = name.partition(".experts.")
        if not kind:
            model_tensors[name] = tensor
            continue
        if kind.endswith("_scales") and name.replace("_scales", "_blocks") in tensors:
            continue  # NOTE: read with its blocks
        scales = tensors.get(name.replace("_blocks", "_scales")) if kind.endswith("_blocks") else None
        for expert in range(tensor.shape[0]):
            parts = _expert_tensors(kind, tensor[expert], None if scales is None else scales[expert])
            model_tensors.update({f"{layer}.experts.{expert}.{part}": value for part, value in parts.items()})
    return model_tensors


def _expert_tensors(kind: str, values: Tensor, scales: Tensor | None) -> dict[str, FolderTensor]:
    """One expert's slice of a folder's expert tensor (`kind`: `gate_up_proj`, ...) as its Linear layers' tensors:
    `gate_up_proj` [hidden, 2 × intermediate], `down_proj` [intermediate, hidden], their biases; MXFP4's
    `*_blocks` [outputs, inputs // 32, 16] with `scales` [outputs, inputs // 32] (gate and up rows interleaved) as
    blocks made when asked for."""
    if kind == "gate_up_proj":
        return {"gate_proj.weight": values[:, ::2].T, "up_proj.weight": values[:, 1::2].T}
    if kind == "gate_up_proj_bias":
        return {"gate_proj.bias": values[::2], "up_proj.bias": values[1::2]}
    if kind == "down_proj":
        return {"down_proj.weight": values.T}
    if kind == "down_proj_bias":
        return {"down_proj.bias": values}
    if kind in ("gate_up_proj_blocks", "down_proj_blocks") and scales is not None:
        rows = {"gate_proj": slice(0, None, 2), "up_proj": slice(1, None, 2)} if kind == "gate_up_proj_blocks" else {
            "down_proj": slice(None)}
        return {
            f"{part}.weight": functools.partial(MXFP4Blocks.from_pairs, values[part_rows], scales[part_rows])
            for part, part_rows in rows.items()
        }
    raise ValueError(f"unsupported gpt-oss expert tensor {kind!r} (MXFP4 blocks need their scales)")


FAMILY = Family(
    "gpt_oss", GptOssForCausalLM, hf_model_types=("gpt_oss",), gguf_architectures=("gpt-oss",),
    hf_config=_hf_config, gguf_config=_gguf_config, has_experts=True, hf_renames=((".mlp.router.", ".mlp.gate."),),
    hf_tensors=_hf_tensors,
    gguf_layer_names={"post_attention_norm": "post_attention_layernorm", "attn_sinks.weight": "self_attn.sinks"},
)
