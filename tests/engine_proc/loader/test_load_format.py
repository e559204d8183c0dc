"""`load_format="dummy"` and `hf_overrides`: a model of the configured shape without reading weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine_proc.core import EngineCore
from engine_proc.loader import TORCH_DTYPES, load_model, load_model_config
from proto.engine_config import DTYPES, EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams

SHRINK = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 512}


@pytest.mark.real_model
def test_dummy_weights_take_the_overridden_shape(default_model_path: Path) -> None:
    model = load_model(default_model_path, load_format="dummy", hf_overrides=SHRINK)
    config = model.config
    assert (config.num_hidden_layers, config.hidden_size, config.head_dim, config.vocab_size) == (1, 64, 16, 512)
    assert model.model.embed_tokens.weight.shape == (512, 64)
    assert config.eos_token_ids == load_model_config(default_model_path).eos_token_ids
    assert all(torch.isfinite(param).all() for param in model.parameters())


def test_unknown_override_is_rejected(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="unknown hf_overrides keys"):
        load_model(tiny_model_dir, load_format="dummy", hf_overrides={"num_layers": 1})


def test_engine_generates_from_dummy_weights(tiny_model_dir: Path) -> None:
    config = EngineConfig(
        model_path=str(tiny_model_dir), load_format="dummy", hf_overrides='{"num_hidden_layers": 1}',
        kv_cache_memory_gib=0.01, max_model_len=256,
    )
    core = EngineCore(config)
    assert core.model_runner.model_config.num_hidden_layers == 1
    core.add_request(EngineCoreRequest("a", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)))
    tokens: list[int] = []
    while core.has_work:
        for output in core.step().outputs:
            tokens += output.new_token_ids
    assert len(tokens) == 4


def test_hf_overrides_must_be_a_json_object(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="JSON object"):
        EngineConfig(model_path=str(tiny_model_dir), hf_overrides="[1]")


def test_the_loader_takes_each_dtype_setting_and_refuses_others(tiny_model_dir: Path) -> None:
    assert set(TORCH_DTYPES) == set(DTYPES)
    with pytest.raises(ValueError, match="dtype one of"):
        load_model(tiny_model_dir, dtype="float64")
