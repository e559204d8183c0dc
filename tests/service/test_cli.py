"""`zeroserve serve` flags reach the engine's command line, and the engine parses them back."""

from __future__ import annotations

from engine_proc.config import EngineConfig
from engine_proc.main import parse_args
from service.cli import build_parser, config_from_args


def engine_config_for(*flags: str) -> EngineConfig:
    gateway = config_from_args(build_parser().parse_args(["serve", *flags]))
    argv = gateway.engine.to_argv(0, "ipc:///in", "ipc:///out")
    return parse_args(["--model", "m.gguf", *argv[2:]])


def test_defaults_derive_the_kv_cache_and_turn_prefix_caching_on() -> None:
    config = engine_config_for()
    assert config.kv_cache_memory_gib is None
    assert config.enable_prefix_caching is True
    assert config.scheduling_policy == "fcfs"


def test_cache_and_scheduling_flags_pass_through() -> None:
    config = engine_config_for(
        "--kv-cache-memory", "0.5", "--no-enable-prefix-caching", "--scheduling-policy", "priority"
    )
    assert config.kv_cache_memory_gib == 0.5
    assert config.enable_prefix_caching is False
    assert config.scheduling_policy == "priority"


def test_request_limits_default_and_override() -> None:
    parser = build_parser()
    defaults = config_from_args(parser.parse_args(["serve"]))
    assert (defaults.max_n, defaults.max_request_body_bytes) == (16, 8 * 2**20)
    custom = config_from_args(parser.parse_args(["serve", "--max-n", "4", "--max-request-body-bytes", "1000"]))
    assert (custom.max_n, custom.max_request_body_bytes) == (4, 1000)
