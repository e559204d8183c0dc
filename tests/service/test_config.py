"""Every gateway setting declared in GatewayConfig is a `zeroserve serve` flag with the same default."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from proto.settings import flag_of
from service.cli.main import build_parser, config_from_args, main
from service.cli.setting_flags import settings_of
from service.config import GatewayConfig

# A value other than the default for every declared gateway setting.
OTHER_VALUES: dict[str, Any] = {
    "host": "0.0.0.0", "port": 9000, "log_format": "json", "data_parallel_size": 2, "api_server_count": 1,
    "max_n": 4, "max_request_body_bytes": 1000, "is_metrics_auth": True, "max_num_queued_requests": 0,
    "request_timeout_s": 2.5, "shutdown_timeout_s": 0.0, "sse_keepalive_s": 0.0, "max_header_bytes": 2048,
}
DECLARED = settings_of(GatewayConfig)


def test_every_declared_setting_has_another_value_to_test() -> None:
    assert sorted(OTHER_VALUES) == sorted(config_field.name for config_field in DECLARED)
    defaults = {config_field.name: config_field.default for config_field in DECLARED}
    assert all(value != defaults[name] for name, value in OTHER_VALUES.items() if name != "api_server_count")


def test_serve_without_flags_gives_every_default() -> None:
    config = config_from_args(build_parser().parse_args(["serve"]))
    assert all(getattr(config, config_field.name) == config_field.default for config_field in DECLARED)


@pytest.mark.parametrize("config_field", DECLARED, ids=lambda config_field: config_field.name)
def test_each_flag_sets_its_setting(config_field: dataclasses.Field[Any]) -> None:
    value = OTHER_VALUES[config_field.name]
    flags = [flag_of(config_field)] if value is True else [flag_of(config_field), str(value)]
    config = config_from_args(build_parser().parse_args(["serve", *flags]))
    assert getattr(config, config_field.name) == value


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--port", "70000"], "--port: must be in [0, 65535]"), (["--max-header-bytes", "10"], "--max-header-bytes"),
     (["--sse-keepalive", "nan"], "--sse-keepalive: must be >= 0")],
)
def test_a_value_out_of_range_exits_2_naming_the_flag(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *flags]) == 2
    assert named in capsys.readouterr().err
