"""ModelConfig validation and derived values."""

from __future__ import annotations

import dataclasses

import pytest

from engine_proc.models.config import ModelConfig

SMOL = ModelConfig(
    architecture="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=True,
    eos_token_ids=(2,),
    bos_token_id=1,
)


def test_derived_sizes() -> None:
    assert (SMOL.num_queries_per_kv, SMOL.q_size, SMOL.kv_size) == (3, 576, 192)
    assert SMOL.rope_scaling_params == {}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_key_value_heads": 4}, "not a multiple"),
        ({"architecture": "gpt2"}, "unsupported architecture"),
        ({"head_dim": 63}, "head_dim must be even"),
        ({"num_hidden_layers": 0}, "num_hidden_layers must be positive"),
        ({"rope_scaling": (("factor", 4.0), ("rope_type", "dynamic"))}, "supported: llama3, linear, yarn"),
        ({"rope_scaling": (("factor", 4.0), ("rope_type", "yarn"))}, "yarn rope scaling needs a numeric original"),
        ({"rope_scaling": (("factor", 8.0), ("rope_type", "llama3"))}, "missing numeric low_freq_factor"),
    ],
)
def test_invalid_configs_are_rejected(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SMOL, **change)


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SMOL.vocab_size = 1  # type: ignore[misc]
