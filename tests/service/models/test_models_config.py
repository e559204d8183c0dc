"""--models-config: each model's aliases and settings read from TOML or YAML, each key as its field or its
flag is named, each value checked by its setting's own check."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.models.models_config import read_models_config


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_a_key_is_a_field_or_a_flag_name_with_dashes_or_underscores(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
[models.a]
kv-cache-memory = 0.5
max_num_seqs = 4
override-generation-config = {temperature = 0.2}
[models.b]
kv_cache_memory_gib = 0.5
max-num-seqs = 4
generation_config = '{"temperature": 0.2}'
""")
    models = read_models_config(path)
    assert models["a"].engine_settings == models["b"].engine_settings == {"kv_cache_memory_gib": 0.5, "max_num_seqs": 4}
    assert models["a"].gateway_settings == models["b"].gateway_settings == {"generation_config": (("temperature", 0.2),)}


def test_yaml_holds_the_same_under_models(tmp_path: Path) -> None:
    path = write(tmp_path / "models.yaml", """
models:
  qwen:
    model: /models/qwen.gguf
    aliases: [gpt-4o-mini, q]
    speculative_config: {method: ngram, num_speculative_tokens: 2}
    reasoning-parser: qwen3
    data_parallel_size: 2
""")
    (qwen,) = read_models_config(path).values()
    assert (qwen.model, qwen.aliases) == ("/models/qwen.gguf", ("gpt-4o-mini", "q"))
    assert json.loads(qwen.engine_settings["speculative_config"]) == {"method": "ngram", "num_speculative_tokens": 2}
    assert qwen.gateway_settings == {"reasoning_parser": "qwen3", "data_parallel_size": 2}


def test_a_json_setting_is_a_table_or_its_json(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", """
[models.a]
speculative_config = {method = "ngram", num_speculative_tokens = 2}
[models.b]
speculative_config = '{"method": "ngram", "num_speculative_tokens": 2}'
""")
    models = read_models_config(path)
    assert [json.loads(m.engine_settings["speculative_config"]) for m in models.values()] == [
        {"method": "ngram", "num_speculative_tokens": 2}
    ] * 2


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('[models.qwen]\nmax_model_len = 0', "model 'qwen': max_model_len: must be >= 1, got 0"),
        ('[models.qwen]\nmax-model-len = "long"', "model 'qwen': max-model-len must be int or None"),
        ('[models.qwen]\ndtype = "float8"', "model 'qwen': dtype must be one of auto, float32"),
        ('[models.qwen]\nspeculative_config = {method = "eagle"}', "model 'qwen': speculative_config: method 'eagle'"),
        ('[models.qwen]\noverride_generation_config = {temprature = 1.0}', "model 'qwen': override_generation_config"),
        ('[models.qwen]\nmax_modle_len = 4096', "model 'qwen': unknown key 'max_modle_len'; known: model, aliases"),
        ('[models.qwen]\nport = 9000', "model 'qwen': unknown key 'port'"),
        ('[models.qwen]\naliases = ["q", "q"]', "model 'qwen': aliases repeat a name"),
        ('[models.qwen]\nkv-cache-memory = 1\nkv_cache_memory_gib = 2', "model 'qwen': kv_cache_memory_gib sets"),
        ('[model.qwen]\nmax_model_len = 4096', "must hold only a `models` table"),
        ('[models.qwen\n', "cannot be read"),
    ],
)
def test_a_bad_entry_is_refused_naming_the_file_the_model_and_the_key(tmp_path: Path, text: str, named: str) -> None:
    path = write(tmp_path / "models.toml", text)
    with pytest.raises(ValueError, match="^--models-config .*models.toml: ") as caught:
        read_models_config(path)
    assert named in str(caught.value)


def test_the_unknown_key_message_lists_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path / "models.toml", "[models.qwen]\nmax_modle_len = 4096")
    with pytest.raises(ValueError) as caught:
        read_models_config(path)
    assert all(key in str(caught.value) for key in ("max_model_len", "kv_cache_memory_gib", "reasoning_parser"))


@pytest.mark.parametrize("name", ["models.json", "missing.toml"])
def test_a_file_of_another_kind_or_none_is_refused_naming_it(tmp_path: Path, name: str) -> None:
    if name.endswith(".json"):
        (tmp_path / name).write_text("{}")
    with pytest.raises(ValueError, match=f"^--models-config {tmp_path / name}: "):
        read_models_config(str(tmp_path / name))
