"""Reading Hugging Face config.json files in their old and new shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine_proc.loader import load_model_config
from engine_proc.loader.hf_loader import config_from_hf

BASE: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "eos_token_id": 128001,
}
LLAMA3_SCALING = {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}


def test_old_format_llama3_rope_and_generation_eos_list(tmp_path: Path) -> None:
    raw = {
        **BASE,
        "rope_theta": 500000.0,
        "rope_scaling": {**LLAMA3_SCALING, "rope_type": "llama3", "type": "llama3"},
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [128001, 128008, 128009]}))
    config = load_model_config(tmp_path)
    assert config.rope_theta == 500000.0
    assert config.rope_scaling_params == {**LLAMA3_SCALING, "rope_type": "llama3"}
    assert config.eos_token_ids == (128001, 128008, 128009)
    assert config.head_dim == 64


def test_new_format_rope_parameters() -> None:
    config = config_from_hf({**BASE, "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"}}, {})
    assert (config.rope_theta, config.rope_scaling, config.eos_token_ids) == (1e6, None, (128001,))


def test_unsupported_rope_scaling_is_rejected() -> None:
    with pytest.raises(ValueError, match="unsupported rope scaling type 'dynamic'"):
        config_from_hf({**BASE, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}}, {})


def test_a_sliding_window_reaches_the_layers_as_transformers_places_it() -> None:
    mistral = config_from_hf({**BASE, "model_type": "mistral", "sliding_window": 4096}, {})
    assert mistral.max_position_embeddings == 131072  # no longer capped at the window
    assert (mistral.sliding_window, mistral.sliding_layers) == (4096, (True,) * BASE["num_hidden_layers"])
    qwen2 = config_from_hf({**BASE, "model_type": "qwen2", "sliding_window": 16, "use_sliding_window": True,
                            "max_window_layers": 1}, {})
    assert qwen2.sliding_layers == (False,) + (True,) * (BASE["num_hidden_layers"] - 1)
    assert config_from_hf({**BASE, "model_type": "qwen2", "sliding_window": 16}, {}).sliding_window is None


def test_missing_directory_contents_are_reported(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model_config(tmp_path)
