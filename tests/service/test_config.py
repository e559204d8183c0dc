"""Every gateway setting declared in GatewayConfig (and its LinkSettings) is a `zeroserve serve`
flag with the same default."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from proto.engine_config import EngineConfig
from proto.settings import flag_of
from service.cli.main import build_parser, config_from_args, main
from service.client.curve import LinkSettings
from service.config import GatewayConfig
from service.flags.setting_flags import settings_of

# A value other than the default for every declared gateway setting.
OTHER_VALUES: dict[str, Any] = {
    "host": "0.0.0.0", "port": 9000, "served_model_names": ("a", "b"), "generation_config": (("temperature", 0.5),),
    "log_format": "json", "data_parallel_size": 2, "api_server_count": 1, "api_server_index": 1, "listen_fd": 5,
    "engine_addresses": ("ipc:///in", "ipc:///out"), "max_n": 4, "max_request_body_bytes": 1000,
    "max_upload_bytes": 2**20, "allowed_origins": ("http://a.example", "https://b.example:8443"),
    "tool_call_parser": "hermes", "reasoning_parser": "qwen3",
    "api_keys": ("k1", "k2"), "is_metrics_auth": True, "max_num_queued_requests": 0, "request_timeout_s": 2.5,
    "shutdown_timeout_s": 0.0, "sse_keepalive_s": 0.0, "max_header_bytes": 2048, "stream_retention_s": 60.0,
    "stream_retention_mib": 16, "responses_store": "off", "store_owner": "gateway-a", "store_max_bytes": 2**20,
    "max_batch_lines": 4, "models_dir": "/models", "models_config": "/models/models.toml", "max_loaded_models": 2,
    "memory_budget": 16 * 2**30, "idle_unload_s": 300.0,
}
OTHER_LINK_VALUES: dict[str, Any] = {
    "engine_address": "tcp://10.0.0.1:5555", "curve_secret_key": "gateway.key_secret",
    "curve_authorized_keys": "engines/", "heartbeat_timeout_s": 2.0, "is_engine_restart": False,
    "engine_recovery_timeout_s": 30.0,
}
# NOTE: the CURVE flags go together.
TOGETHER = {"curve_secret_key": "curve_authorized_keys", "curve_authorized_keys": "curve_secret_key"}
DECLARED = settings_of(GatewayConfig)
DECLARED_LINK = settings_of(LinkSettings)


def flag_argv(config_field: dataclasses.Field[Any], value: Any) -> list[str]:
    """The command line that gives the setting `value`."""
    flag = flag_of(config_field)
    if value is True:
        return [flag]
    if value is False:
        return [f"--no-{flag[2:]}"]
    if config_field.metadata["is_repeated"]:
        return [part for item in value for part in (flag, item)]
    if config_field.metadata["parse"] is not None and isinstance(value, tuple):
        return [flag, json.dumps(dict(value))]
    return [flag, *map(str, value if isinstance(value, tuple) else (value,))]


def test_every_field_is_a_setting_or_a_nest_of_them() -> None:
    nests = {"model": "str", "models": "tuple[str, ...]", "engine": EngineConfig.__name__, "link": LinkSettings.__name__}
    assert {f.name for f in dataclasses.fields(GatewayConfig)} - {f.name for f in DECLARED} == set(nests)
    assert all(f.type == nests[f.name] for f in dataclasses.fields(GatewayConfig) if f.name in nests)
    assert DECLARED_LINK == list(dataclasses.fields(LinkSettings))


def test_every_declared_setting_has_another_value_to_test() -> None:
    for values, declared in ((OTHER_VALUES, DECLARED), (OTHER_LINK_VALUES, DECLARED_LINK)):
        assert sorted(values) == sorted(config_field.name for config_field in declared)
        defaults = {config_field.name: config_field.default for config_field in declared}
        assert all(value != defaults[name] for name, value in values.items() if name != "api_server_count")


def test_serve_without_flags_gives_every_default() -> None:
    config = config_from_args(build_parser().parse_args(["serve"]))
    assert all(getattr(config, config_field.name) == config_field.default for config_field in DECLARED)
    assert all(getattr(config.link, config_field.name) == config_field.default for config_field in DECLARED_LINK)


@pytest.mark.parametrize("config_field", DECLARED, ids=lambda config_field: config_field.name)
def test_each_flag_sets_its_setting(config_field: dataclasses.Field[Any]) -> None:
    value = OTHER_VALUES[config_field.name]
    config = config_from_args(build_parser().parse_args(["serve", *flag_argv(config_field, value)]))
    assert getattr(config, config_field.name) == value


@pytest.mark.parametrize("config_field", DECLARED_LINK, ids=lambda config_field: config_field.name)
def test_each_link_flag_sets_its_setting(config_field: dataclasses.Field[Any]) -> None:
    argv = flag_argv(config_field, OTHER_LINK_VALUES[config_field.name])
    if config_field.name in TOGETHER:
        partner = next(f for f in DECLARED_LINK if f.name == TOGETHER[config_field.name])
        argv += flag_argv(partner, OTHER_LINK_VALUES[partner.name])
    config = config_from_args(build_parser().parse_args(["serve", *argv]))
    assert getattr(config.link, config_field.name) == OTHER_LINK_VALUES[config_field.name]


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--port", "70000"], "--port: must be in [0, 65535]"), (["--max-header-bytes", "10"], "--max-header-bytes"),
     (["--sse-keepalive", "nan"], "--sse-keepalive: must be >= 0"),
     (["--override-generation-config", '{"temprature": 1}'], "--override-generation-config: unknown keys"),
     (["--override-generation-config", "[1]"], "--override-generation-config"),
     (["--api-key", " k"], "--api-key: keys must be non-empty"),
     (["--heartbeat-timeout", "0"], "--heartbeat-timeout: must be > 0"),
     (["--memory-budget", "16 parsecs"], "--memory-budget: must be a size such as 16GiB"),
     (["--memory-budget", "0GiB"], "--memory-budget: must be > 0"),
     (["--max-loaded-models", "0"], "--max-loaded-models: must be >= 1"),
     (["--engine-address", "10.0.0.1:5555"], "--engine-address"),
     (["--curve-secret-key", "gateway.key_secret"], "--curve-secret-key and --curve-authorized-keys go together")],
)
def test_a_value_out_of_range_exits_2_naming_the_flag(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert exit_status(["serve", *flags]) == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    ("size", "num_bytes"),
    [("16GiB", 16 * 2**30), ("16G", 16 * 2**30), ("512 MiB", 512 * 2**20), ("1.5gib", 3 * 2**29), ("12GB", 12 * 10**9),
     ("4096", 4096)],
)
def test_memory_budget_takes_a_size_as_people_write_it(size: str, num_bytes: int) -> None:
    assert config_from_args(build_parser().parse_args(["serve", "--memory-budget", size])).memory_budget == num_bytes


def exit_status(argv: list[str]) -> int | str | None:
    """main's status, whether it returns it or argparse exits with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_hidden_flags_have_no_help_line_nor_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    hidden = [flag_of(f) for f in DECLARED if f.metadata["is_hidden"]]
    assert hidden == ["--api-server-index", "--listen-fd", "--engine-addresses"]
    assert not any(flag in text for flag in hidden)
