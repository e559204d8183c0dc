"""The ModelConfig fields every family reads the same way from a Hugging Face config.json."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from engine_proc.models.family import Fields

_DEFAULT_ROPE_TYPES = (None, "default")


def common_fields(raw: Mapping[str, Any], generation: Mapping[str, Any]) -> Fields:
    """The Llama family's fields of config.json (and EOS / BOS ids from generation_config.json)."""
    if raw.get("mlp_bias", False):
        raise ValueError("MLP biases are not supported")
    num_heads = raw["num_attention_heads"]
    rope_theta, rope_scaling = rope(raw)
    window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
    return dict(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_hidden_layers=raw["num_hidden_layers"],
        num_attention_heads=num_heads,
        num_key_value_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=raw.get("max_position_embeddings", 2048),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        attention_bias=bool(raw.get("attention_bias", False)),
        rope_scaling=rope_scaling,
        eos_token_ids=token_ids(generation.get("eos_token_id", raw.get("eos_token_id"))),
        bos_token_id=generation.get("bos_token_id", raw.get("bos_token_id")),
        hidden_act=raw.get("hidden_act", "silu"),
        # NOTE: as transformers: Mistral's every layer slides, Qwen2's from `max_window_layers` on.
        **sliding_layers(raw, window),
    )


def sliding_layers(raw: Mapping[str, Any], window: int | None, default_type: str = "sliding_attention") -> Fields:
    """`sliding_window` and `sliding_layers` of a config whose layers slide as `layer_types` says, or (no
    `layer_types`) from `max_window_layers` on, each `default_type`; none where the window is off or spans
    every position."""
    if window is None or window >= raw.get("max_position_embeddings", 2048):
        return {}
    layer_types = raw.get("layer_types") or [
        default_type if i >= raw.get("max_window_layers", 0) else "full_attention"
        for i in range(raw["num_hidden_layers"])
    ]
    sliding = tuple(kind == "sliding_attention" for kind in layer_types)
    return {"sliding_window": window, "sliding_layers": sliding} if any(sliding) else {}


def opt_in_window(raw: Mapping[str, Any], fields: Fields) -> Fields:
    """`fields` without a sliding window unless `use_sliding_window` turns it on (as transformers' config classes
    default it for Qwen2, Qwen2-MoE, Qwen3-MoE and SmolLM3)."""
    return fields if raw.get("use_sliding_window", False) else {**fields, "sliding_window": None, "sliding_layers": ()}


def rope(raw: Mapping[str, Any]) -> tuple[float, tuple[tuple[str, float | str], ...] | None]:
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


def token_ids(value: int | list[int] | None) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(dict.fromkeys(value))
