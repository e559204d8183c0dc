"""Build a ready model from a GGUF file or a Hugging Face directory (or random weights of its shape)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from engine_proc.cpu_features import cpu_features
from engine_proc.loader.gguf_loader import load_gguf, load_gguf_config
from engine_proc.loader.hf_loader import load_hf_config, load_hf_dir
from engine_proc.models.config import ModelConfig
from engine_proc.models.llama import LlamaForCausalLM
from engine_proc.models.quantized_linear import is_int4_supported
from engine_proc.models.weight_blocks import Q4Blocks
from proto.engine_config import LOAD_FORMATS, QUANTIZATIONS

__all__ = ["load_gguf", "load_hf_dir", "load_model", "load_model_config"]

logger = logging.getLogger(__name__)

_DUMMY_SCALE = 0.02


def load_model_config(path: str | Path, hf_overrides: Mapping[str, Any] | None = None) -> ModelConfig:
    """The config of a `.gguf` file or a Hugging Face directory, without reading the weights."""
    config = load_gguf_config(path) if _is_gguf(path) else load_hf_config(path)
    return with_overrides(config, hf_overrides or {})


def load_model(
    path: str | Path,
    dtype: torch.dtype | None = torch.float32,
    device: str | torch.device = "cpu",
    *,
    quantization: str = "none",
    load_format: str = "auto",
    hf_overrides: Mapping[str, Any] | None = None,
    batch_invariant: bool = True,
) -> LlamaForCausalLM:
    """Load a `.gguf` file or a Hugging Face directory into an inference-ready model.

    `dtype=None` ("auto") picks bfloat16 for a GGUF with 4-bit weights (which run as int4 with
    bfloat16 activations) and for dummy weights, else the checkpoint's own floating dtype; float32
    on an x86 CPU without AVX2; bfloat16 (float16 where unsupported) on a CUDA GPU. Each matmul's form per batch size is measured here (matmul_plan).
    `quantization`: "auto" runs a GGUF's 4-bit blocks as int4 (for small batches) when the
    dtype allows it, "gguf" insists on it, "none" dequantizes every weight.
    `load_format="dummy"` reads only the config and fills the weights with random values;
    `hf_overrides` replaces config fields (Hugging Face names) before the model is built.
    `batch_invariant`: every matmul runs one row-invariant form at every batch size where it has one.
    """
    if load_format not in LOAD_FORMATS or quantization not in QUANTIZATIONS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, quantization one of {QUANTIZATIONS}")
    device = torch.device(device)
    is_dummy = load_format == "dummy"
    weights: dict[str, torch.Tensor] | None = None
    int4_blocks: dict[str, Q4Blocks] = {}
    if is_dummy:
        config = load_model_config(path)
    elif _is_gguf(path):
        config, weights, int4_blocks = load_gguf(path)
    else:
        config, weights = load_hf_dir(path)
    config = with_overrides(config, hf_overrides or {})
    if dtype is None:
        dtype = _auto_dtype(weights, int4_blocks, device)
    # NOTE: built on the meta device so no memory or time goes to random initialisation.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # NOTE: `to_empty` but with `torch.empty` of each shape: `to_empty`'s `empty_like` of a meta
    # tensor runs torch's Python reference, which imports sympy (0.3 s of every engine's start).
    model = model.to(dtype=dtype)._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    if weights is None:
        _fill_random(model)
    else:
        model.load_weights(weights)
    if quantization != "none":
        _load_int4(model, int4_blocks, dtype, device, is_required=quantization == "gguf")
        if model.model.layers[0].mlp.down_proj.int4_weight is not None and weights is not None:
            name = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
            model.set_int8_lm_head(weights[name])
    model.eval().requires_grad_(False)
    started = time.perf_counter()
    model.prepack(is_measured=True, is_batch_invariant=batch_invariant)
    saved = f"; {model.num_saved_plans} plans measured by an earlier load" if model.num_saved_plans else ""
    logger.info("%s (chosen in %.1f s%s)", describe_choices(model.choices), time.perf_counter() - started, saved)
    return model


def describe_choices(choices: Mapping[str, str]) -> str:
    """"linears: int4 ≤2 tokens, int8 above; head: int8; ..." for the startup log."""
    return "; ".join(f"{piece}: {choice}" for piece, choice in choices.items())


def _auto_dtype(
    weights: dict[str, torch.Tensor] | None, int4_blocks: dict[str, Q4Blocks], device: torch.device
) -> torch.dtype:
    # NOTE: an x86 CPU without AVX2 runs bfloat16 as scalar code: float32 is both exact and faster there.
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    features = cpu_features()
    if device.type == "cpu" and features.is_x86 and not features.has_avx2:
        return torch.float32
    if weights is None or (int4_blocks and is_int4_supported(torch.bfloat16, device)):
        return torch.bfloat16
    dtypes = [tensor.dtype for tensor in weights.values() if tensor.is_floating_point()]
    return max(set(dtypes), key=dtypes.count) if dtypes else torch.float32


def with_overrides(config: ModelConfig, overrides: Mapping[str, Any]) -> ModelConfig:
    """The config with some fields replaced; head_dim follows hidden_size / heads unless it is given."""
    fields = {field.name for field in dataclasses.fields(ModelConfig)}
    unknown = sorted(overrides.keys() - fields)
    if unknown:
        raise ValueError(f"unknown hf_overrides keys {unknown}; known: {sorted(fields)}")
    changes = dict(overrides)
    is_derived = config.head_dim == config.hidden_size // config.num_attention_heads
    if "head_dim" not in changes and is_derived and changes.keys() & {"hidden_size", "num_attention_heads"}:
        num_heads = changes.get("num_attention_heads", config.num_attention_heads)
        changes["head_dim"] = changes.get("hidden_size", config.hidden_size) // num_heads
    if "eos_token_ids" in changes:
        changes["eos_token_ids"] = tuple(changes["eos_token_ids"])
    return dataclasses.replace(config, **changes)


def _load_int4(
    model: LlamaForCausalLM,
    int4_blocks: dict[str, Q4Blocks],
    dtype: torch.dtype,
    device: torch.device,
    is_required: bool,
) -> None:
    num_packed = model.load_blocks(dict(int4_blocks)) if is_int4_supported(dtype, device) else 0
    if is_required and num_packed == 0:
        raise ValueError(
            "quantization 'gguf' needs a GGUF file with Q4_0/Q4_1 weights, dtype bfloat16 and the CPU"
        )
    if num_packed:
        logger.info("int4 weights (GGUF 4-bit blocks) for %d projections", num_packed)


@torch.no_grad()
def _fill_random(model: LlamaForCausalLM) -> None:
    """Random weights of the right shape (norms at one), reproducible across processes."""
    generator = torch.Generator().manual_seed(0)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        else:
            values = torch.randn(param.shape, generator=generator) * _DUMMY_SCALE
            param.copy_(values)
    model.model.rotary_emb.reset_cache()


def _is_gguf(path: str | Path) -> bool:
    resolved = Path(path)
    if resolved.is_file() and resolved.suffix == ".gguf":
        return True
    if resolved.is_dir():
        return False
    raise FileNotFoundError(f"{resolved} is neither a .gguf file nor a model directory")
