"""Load a Hugging Face model directory: config.json, generation_config.json and *.safetensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import load_file
from torch import Tensor

from engine_proc.models.config import ModelConfig
from proto.model_support import HF_ARCHITECTURES

_DEFAULT_ROPE_TYPES = (None, "default")
NORM_SHIFTED = frozenset({"gemma3"})  # architectures whose checkpoints hold norm weights as w for (1 + w)


def load_hf_config(path: str | Path) -> ModelConfig:
    """Read the model config (and EOS ids from generation_config.json) of a Hugging Face directory."""
    root = Path(path)
    raw = _read_json(root / "config.json")
    if raw is None:
        raise FileNotFoundError(f"{root} has no config.json")
    generation = _read_json(root / "generation_config.json") or {}
    return config_from_hf(raw, generation)


def load_hf_dir(path: str | Path) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Config and all safetensors tensors (sharded or not) of a Hugging Face directory."""
    root = Path(path)
    config = load_hf_config(root)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{root} has no *.safetensors files")
    weights: dict[str, Tensor] = {}
    for file in files:
        shard = load_file(file)
        duplicated = weights.keys() & shard.keys()
        if duplicated:
            raise ValueError(f"{file.name} repeats tensors already loaded: {sorted(duplicated)[:5]}")
        weights.update(shard)
    if config.architecture in NORM_SHIFTED:
        # NOTE: Gemma's RMSNorm multiplies by (1 + w); the model holds (1 + w), as llama.cpp's GGUFs do.
        weights.update({name: t.float() + 1 for name, t in weights.items() if name.endswith("norm.weight")})
    return config, weights


def hf_tensor_names(path: str | Path) -> set[str]:
    """The names of the tensors in a Hugging Face directory's safetensors files, read from their headers."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} has no *.safetensors files")
    names: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt") as shard:
            names.update(shard.keys())
    return names


def config_from_hf(raw: dict[str, Any], generation: dict[str, Any]) -> ModelConfig:
    """Build a ModelConfig from parsed config.json and generation_config.json contents."""
    architecture = HF_ARCHITECTURES.get(raw.get("model_type", ""), raw.get("model_type", ""))
    if architecture == "gemma3":
        return _gemma3_config(raw, generation)
    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported hidden_act {raw['hidden_act']!r}; only 'silu' is supported")
    if raw.get("mlp_bias", False):
        raise ValueError("MLP biases are not supported")
    num_heads = raw["num_attention_heads"]
    max_positions = raw.get("max_position_embeddings", 2048)
    # NOTE: as transformers' config classes default it: Qwen2's window is off unless the config turns it on.
    window = raw.get("sliding_window") if raw.get("use_sliding_window", architecture != "qwen2") else None
    sliding_layers: tuple[bool, ...] = ()
    if window is not None and window < max_positions:
        # NOTE: as transformers: Mistral's every layer slides, Qwen2's from `max_window_layers` on.
        layer_types = raw.get("layer_types") or [
            "sliding_attention" if i >= raw.get("max_window_layers", 0) else "full_attention"
            for i in range(raw["num_hidden_layers"])
        ]
        sliding_layers = tuple(kind == "sliding_attention" for kind in layer_types)
    rope_theta, rope_scaling = _rope(raw)
    eos = generation.get("eos_token_id", raw.get("eos_token_id"))
    bos = generation.get("bos_token_id", raw.get("bos_token_id"))
    return ModelConfig(
        architecture=architecture,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=num_heads,
        num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=max_positions,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=architecture == "qwen2" or bool(raw.get("attention_bias", False)),
        qk_norm=architecture == "qwen3",
        rope_scaling=rope_scaling,
        eos_token_ids=_token_ids(eos),
        bos_token_id=bos,
        sliding_window=window if any(sliding_layers) else None,
        sliding_layers=sliding_layers if any(sliding_layers) else (),
    )


def _gemma3_config(raw: dict[str, Any], generation: dict[str, Any]) -> ModelConfig:
    """Gemma 3's text config: local (sliding) and global layers, each kind with its own rotary parameters."""
    if raw.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        raise ValueError(f"unsupported hidden_activation {raw['hidden_activation']!r}; only 'gelu_pytorch_tanh' is")
    if raw.get("final_logit_softcapping") or raw.get("attn_logit_softcapping"):
        raise ValueError("logit soft-capping (Gemma 2) is not supported")
    num_layers = raw["num_hidden_layers"]
    pattern = raw.get("sliding_window_pattern", 6)
    layer_types = raw.get("layer_types") or [
        "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(num_layers)
    ]
    parameters = raw.get("rope_parameters") or {}
    full = dict(parameters.get("full_attention") or {"rope_theta": raw.get("rope_theta", 1_000_000.0),
                                                        **(raw.get("rope_scaling") or {})})
    local = parameters.get("sliding_attention") or {"rope_theta": raw.get("rope_local_base_freq", 10_000.0)}
    rope_theta, rope_scaling = _rope({"rope_parameters": full})
    num_heads = raw["num_attention_heads"]
    eos = generation.get("eos_token_id", raw.get("eos_token_id"))
    return ModelConfig(
        architecture="gemma3",
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=raw.get("max_position_embeddings", 131072),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", True)),
        attention_bias=bool(raw.get("attention_bias", False)),
        qk_norm=True,
        rope_scaling=rope_scaling,
        eos_token_ids=_token_ids(eos),
        bos_token_id=generation.get("bos_token_id", raw.get("bos_token_id")),
        hidden_act="gelu_tanh",
        sliding_window=raw.get("sliding_window"),
        sliding_layers=tuple(kind == "sliding_attention" for kind in layer_types),
        local_rope_theta=float(local.get("rope_theta", 10_000.0)),
        query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar") or raw.get("head_dim") or 256),
    )


def _rope(raw: dict[str, Any]) -> tuple[float, tuple[tuple[str, float | str], ...] | None]:
    """rope_theta and rope scaling, from the old (`rope_scaling`) or new (`rope_parameters`) format."""
    params: dict[str, Any] = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    rope_theta = float(raw.get("rope_theta") or params.pop("rope_theta", None) or 10000.0)
    params.pop("rope_theta", None)
    rope_type = params.pop("rope_type", None)
    legacy_type = params.pop("type", None)
    rope_type = rope_type or legacy_type
    if rope_type in _DEFAULT_ROPE_TYPES:
        return rope_theta, None
    scaling = {"rope_type": rope_type, **params}
    return rope_theta, tuple(
        sorted((key, value) for key, value in scaling.items() if isinstance(value, (int, float, str)))
    )


def _token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(dict.fromkeys(value))


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    with path.open(encoding="utf-8") as file:
        data: dict[str, Any] = json.load(file)
    return data
