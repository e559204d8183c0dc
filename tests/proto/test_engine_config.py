"""Every engine setting, declared once in EngineConfig, reaches every surface with the same default."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from engine_proc.main import parse_args as parse_engine_process_args
from proto.engine_config import EngineConfig, SpeculativeConfig, settings_from
from proto.settings import flag_of
from service.cli.main import _subparser, build_parser
from service.client.engine_launcher import engine_argv
from service.flags.engine_flags import engine_config_from
from service.frontend.llm import LLM

# A value other than the default for every setting: a new setting must be added here, and the
# tests below then check it on every surface.
OTHER_VALUES: dict[str, Any] = {
    "model_path": "/models/m.gguf",
    "model_name": "m",
    "dtype": "float32",
    "quantization": "none",
    "load_format": "dummy",
    "hf_overrides": '{"num_hidden_layers": 1}',
    "speculative_config": '{"method": "ngram", "num_speculative_tokens": 2}',
    "structured_outputs_config": '{"backend": "xgrammar", "compile_timeout_s": 2.5}',
    "kv_events_config": '{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557"}',
    "device": "cpu",
    "block_size": 32,
    "kv_cache_memory_gib": 0.5,
    "max_model_len": 1024,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 1024,
    "num_threads": 1,
    "enable_prefix_caching": False,
    "batch_invariant": False,
    "scheduling_policy": "priority",
}

# The commands that start an engine, with the arguments each needs besides the engine flags.
COMMANDS = {
    "serve": ["serve"],
    "engine": ["engine", "--gateway", "tcp://127.0.0.1:5555"],
    "generate": ["generate", "--input", "in.jsonl", "--output", "out.jsonl"],
    "bench throughput": ["bench", "throughput"],
}

FLAGGED = [config_field for config_field in dataclasses.fields(EngineConfig) if "flag" in config_field.metadata]


def flag_argv(config_field: dataclasses.Field[Any], value: Any) -> list[str]:
    if isinstance(value, bool):
        return [flag_of(config_field) if value else "--no-" + flag_of(config_field).removeprefix("--")]
    return [flag_of(config_field), str(value)]


def test_every_setting_has_another_value_to_test() -> None:
    assert sorted(OTHER_VALUES) == sorted(config_field.name for config_field in dataclasses.fields(EngineConfig))
    assert all(OTHER_VALUES[name] != config_field.default
               for name, config_field in {f.name: f for f in dataclasses.fields(EngineConfig)}.items())


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_every_flag_with_the_configs_default(command: str) -> None:
    args = build_parser().parse_args(COMMANDS[command])
    assert engine_config_from(args) == EngineConfig()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("config_field", FLAGGED, ids=lambda config_field: config_field.name)
def test_each_flag_sets_its_setting(command: str, config_field: dataclasses.Field[Any]) -> None:
    value = OTHER_VALUES[config_field.name]
    args = build_parser().parse_args([*COMMANDS[command], *flag_argv(config_field, value)])
    assert engine_config_from(args) == EngineConfig(**{config_field.name: value})


def test_the_engine_process_gets_every_setting_whole() -> None:
    config = EngineConfig(**OTHER_VALUES)
    parsed, launch = parse_engine_process_args(engine_argv(config, 2, "ipc:///a,ipc:///b", "ipc:///c,ipc:///d"))
    assert parsed == config
    assert (launch.engine_index, launch.input_addresses, launch.output_addresses) == (
        2, ["ipc:///a", "ipc:///b"], ["ipc:///c", "ipc:///d"]
    )


def test_llm_takes_every_setting_by_its_name_and_declares_none_itself() -> None:
    parameters = inspect.signature(LLM.__init__).parameters
    assert not set(parameters) & set(OTHER_VALUES)
    assert any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values())
    assert EngineConfig(**settings_from(OTHER_VALUES)) == EngineConfig(**OTHER_VALUES)
    as_dicts = {**OTHER_VALUES, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}
    assert EngineConfig(**settings_from(as_dicts)).speculative == SpeculativeConfig(num_speculative_tokens=2)


def test_an_unknown_setting_is_named_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown engine settings \['kv_cache_memory'\]; known: .*kv_cache_memory_gib"):
        settings_from({"kv_cache_memory": 1.0})


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"dtype": "float8"}, "dtype must be one of auto, float32"),
        ({"max_num_seqs": 0}, "max_num_seqs: must be >= 1, got 0"),
        ({"kv_cache_memory_gib": -1.0}, "kv_cache_memory_gib: must be > 0"),
        ({"max_num_seqs": "8"}, "max_num_seqs must be int, got '8'"),
        ({"enable_prefix_caching": 1}, "enable_prefix_caching must be bool"),
        ({"hf_overrides": "[1]"}, "hf_overrides: must be a JSON object"),
        ({"speculative_config": '{"prompt_lookup_min": 5}'}, "need prompt_lookup_min <= prompt_lookup_max"),
        ({"structured_outputs_config": '{"backend": "outlines"}'}, "backend 'outlines' is not supported"),
        ({"structured_outputs_config": '{"compile_timeout_s": 0}'}, "compile_timeout_s must be a positive"),
        ({"structured_outputs_config": '{"timeout": 1}'}, "unknown key 'timeout'"),
    ],
)
def test_a_bad_value_is_refused_naming_the_setting(values: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        EngineConfig(**values)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--max-num-seqs", "0"], "argument --max-num-seqs: must be >= 1, got 0"),
        (["--kv-cache-memory", "none"], "argument --kv-cache-memory: expected a number, got 'none'"),
        (["--hf-overrides", "[1]"], "argument --hf-overrides: must be a JSON object"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(flags: list[str], named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["serve", *flags])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


def test_the_serve_help_lists_every_engine_flag_with_its_default() -> None:
    text = _subparser(build_parser(), "serve").format_help()
    for config_field in FLAGGED:
        assert flag_of(config_field) in text
    assert "(default: 256)" in text and "(default: auto)" in text
