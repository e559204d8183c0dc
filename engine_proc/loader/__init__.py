"""Build a ready model from a GGUF file or a Hugging Face directory (or random weights of its shape)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from engine_proc.cpu.features import cpu_features
from engine_proc.cpu.kernels import load_cpu_kernels
from engine_proc.cpu.policy import MatmulPolicy
from engine_proc.cpu.quantized_linear import is_int4_supported
from engine_proc.cpu.weight_blocks import Q4Blocks, Q8Blocks
from engine_proc.loader.gguf_loader import load_gguf, load_gguf_config
from engine_proc.loader.hf_loader import hf_tensor_names, load_hf_config, load_hf_dir
from engine_proc.loader.model_weights import RoundedAtLoad, TensorDict, WeightSource, check_names, load_weights
from engine_proc.models.config import ModelConfig
from engine_proc.models.llama import LlamaForCausalLM
from engine_proc.models.registry import model_class, reset_rotary_tables
from proto.engine_config import LOAD_FORMATS, QUANTIZATIONS, EngineConfig

__all__ = ["TORCH_DTYPES", "check_model", "load_gguf", "load_hf_dir", "load_model", "load_model_config"]

logger = logging.getLogger(__name__)

_DUMMY_SCALE = 0.02
# the torch dtype of each `dtype` setting; "auto" (None): picked from the checkpoint and the device
TORCH_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
}
# `quantization` values that round a float checkpoint's projections to blocks at load
ROUNDED_KINDS = {"q8_0": Q8Blocks, "q4_0": Q4Blocks}


def load_model_config(path: str | Path, hf_overrides: Mapping[str, Any] | None = None) -> ModelConfig:
    """The config of a `.gguf` file or a Hugging Face directory, without reading the weights."""
    config = load_gguf_config(path) if _is_gguf(path) else load_hf_config(path)
    return with_overrides(config, hf_overrides or {})


def check_model(path: str | Path) -> None:
    """Raises ValueError, in one line, naming what of this `.gguf` file or Hugging Face folder the engine
    cannot run (its architecture, a tensor type, tensors its model lacks or does not have); reads no weights."""
    if _is_gguf(path):
        config, weights = load_gguf(path)
        names = weights.names()
    else:
        config, names = load_hf_config(path), hf_tensor_names(path)
    with torch.device("meta"):
        check_names(model_class(config)(config), names)


def load_model(
    path: str | Path,
    dtype: str | torch.dtype | None = EngineConfig.dtype,
    device: str | torch.device = "cpu",
    *,
    quantization: str = EngineConfig.quantization,
    load_format: str = EngineConfig.load_format,
    hf_overrides: Mapping[str, Any] | None = None,
    batch_invariant: bool = EngineConfig.batch_invariant,
) -> LlamaForCausalLM:
    """Load a `.gguf` file or a Hugging Face directory into an inference-ready model.

    Every setting defaults to the engine's (proto/engine_config.py). `dtype`: one of its names or a
    torch dtype. "auto" (or None) picks bfloat16 for a GGUF whose matrices come as blocks that run fast here
    (4-bit ones on any CPU, 8-bit ones with zeroserve's kernels) and for dummy weights, else the
    checkpoint's own floating dtype; float32 on an x86 CPU without AVX2; bfloat16 (float16 where
    unsupported) on a CUDA GPU. Each matmul's form per batch size is measured here (matmul_plan).
    `quantization`: "auto" runs a GGUF's blocks (Q4_0, Q4_1, Q8_0) as they are when the dtype allows
    it, "gguf" insists on it, "none" dequantizes every weight; "q8_0" / "q4_0" round a float checkpoint's
    projections to those blocks at load (weight-only) and run them on the kernel forms.
    `load_format="dummy"` reads only the config and fills the weights with random values;
    `hf_overrides` replaces config fields (Hugging Face names) before the model is built.
    `batch_invariant`: every matmul runs one row-invariant form at every batch size where it has one;
    a projection such a form runs from the file's blocks is loaded as those blocks alone (model_weights).
    """
    is_known_dtype = not isinstance(dtype, str) or dtype in TORCH_DTYPES
    if load_format not in LOAD_FORMATS or quantization not in QUANTIZATIONS or not is_known_dtype:
        raise ValueError(
            f"load_format must be one of {LOAD_FORMATS}, quantization one of {QUANTIZATIONS}, dtype one of "
            f"{tuple(TORCH_DTYPES)} or a torch dtype"
        )
    if isinstance(dtype, str):
        dtype = TORCH_DTYPES[dtype]
    device = torch.device(device)
    source: WeightSource | None = None
    if load_format == "dummy":
        config = load_model_config(path)
    elif _is_gguf(path):
        config, source = load_gguf(path)
    else:
        config, tensors = load_hf_dir(path)
        source = TensorDict(tensors)
    config = with_overrides(config, hf_overrides or {})
    if quantization in ROUNDED_KINDS and source is not None:
        if source.is_quantized():
            raise ValueError(f"quantization {quantization!r} rounds float weights; this file's are quantized already")
        source = RoundedAtLoad(source, ROUNDED_KINDS[quantization])
    if dtype is None:
        dtype = _auto_dtype(source, device)
    policy = MatmulPolicy.of(batch_invariant)
    # NOTE: built on the meta device so no memory or time goes to random initialisation.
    with torch.device("meta"):
        model = model_class(config)(config)
    # NOTE: `to_empty` but with `torch.empty` of each shape: `to_empty`'s `empty_like` of a meta
    # tensor runs torch's Python reference, which imports sympy (0.3 s of every engine's start). Its
    # pages are taken only as values are written: a weight loaded as blocks alone takes none.
    model = model.to(dtype=dtype)._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    if source is None:
        _fill_random(model)
    else:
        _load(model, source, quantization, policy)
    model.eval().requires_grad_(False)
    started = time.perf_counter()
    model.prepack(policy)
    saved = f"; {model.num_saved_plans} plans measured by an earlier load" if model.num_saved_plans else ""
    logger.info("%s (chosen in %.1f s%s)", describe_choices(model.choices), time.perf_counter() - started, saved)
    return model


def _load(model: LlamaForCausalLM, source: WeightSource, quantization: str, policy: MatmulPolicy) -> None:
    weight = model.lm_head_weight
    use_blocks = quantization != "none" and is_int4_supported(weight.dtype, weight.device)
    kernels = load_cpu_kernels() if use_blocks else None
    if quantization in ROUNDED_KINDS and not use_blocks:
        raise ValueError(f"quantization {quantization!r} runs on the CPU kernels, which need dtype bfloat16 here")
    loaded = load_weights(model, source, use_blocks=use_blocks, kernels=kernels, policy=policy)
    num_blocks = loaded.num_blocks_only + loaded.num_with_blocks
    if quantization == "gguf" and num_blocks == 0:
        raise ValueError(
            "quantization 'gguf' needs a GGUF file with Q4_0, Q4_1 or Q8_0 weights, dtype bfloat16 and the CPU"
        )
    if num_blocks:
        logger.info(
            "the file's blocks for %d projections (%d as blocks alone, packed for the kernels)", num_blocks,
            loaded.num_blocks_only,
        )
    if loaded.num_with_blocks and not policy.is_batch_invariant:
        # NOTE: int8 rows of the head, for the plan by batch size to time beside its other forms.
        model.set_int8_lm_head(source.float("model.embed_tokens.weight" if model.lm_head is None else "lm_head.weight"))


def describe_choices(choices: Mapping[str, str]) -> str:
    """"linears: int4 ≤2 tokens, int8 above; head: int8; ..." for the startup log."""
    return "; ".join(f"{piece}: {choice}" for piece, choice in choices.items())


def _auto_dtype(source: WeightSource | None, device: torch.device) -> torch.dtype:
    # NOTE: an x86 CPU without AVX2 runs bfloat16 as scalar code: float32 is both exact and faster there.
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    features = cpu_features()
    if device.type == "cpu" and features.is_x86 and not features.has_avx2:
        return torch.float32
    if source is None or (source.is_quantized() and is_int4_supported(torch.bfloat16, device)):
        return torch.bfloat16
    dtypes = [tensor.dtype for tensor in map(source.float, source.names()) if tensor.is_floating_point()]
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
    reset_rotary_tables(model)


def _is_gguf(path: str | Path) -> bool:
    resolved = Path(path)
    if resolved.is_file() and resolved.suffix == ".gguf":
        return True
    if resolved.is_dir():
        return False
    raise FileNotFoundError(f"{resolved} is neither a .gguf file nor a model directory")
