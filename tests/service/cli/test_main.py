"""`zeroserve serve` flags reach the engine's command line, and the engine parses them back."""

from __future__ import annotations

import argparse

import pytest

from engine_proc.main import parse_args
from proto import envs
from proto.engine_config import EngineConfig
from service.cli.main import ENV_COMMANDS, build_parser, config_from_args, main
from service.cli.main import parse_args as parse_serve_args
from service.client.engine_launcher import engine_argv
from service.flags.engine_flags import engine_config_from


def engine_config_for(*flags: str) -> EngineConfig:
    gateway = config_from_args(build_parser().parse_args(["serve", *flags]))
    config, launch = parse_args(engine_argv(gateway.engine, 3, "ipc:///in", "ipc:///out"))
    assert (launch.engine_index, launch.input_addresses, launch.output_addresses) == (3, ["ipc:///in"], ["ipc:///out"])
    return config


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


def test_speculative_config_reaches_the_engine() -> None:
    assert engine_config_for().speculative is None
    config = engine_config_for("--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}')
    assert config.speculative is not None
    assert config.speculative.num_speculative_tokens == 2


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"method": "eagle"}', "only ngram"),
        ('{"num_speculative_tokens": 0}', "num_speculative_tokens must be a positive integer"),
        ('{"draft_model": "x"}', "unknown key 'draft_model'"),
        ("[3]", "must be a JSON object"),
    ],
)
def test_a_bad_speculative_config_exits_2_saying_why(text: str, named: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve", "--speculative-config", text], {})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--speculative-config" in err and named in err


def test_request_limits_default_and_override() -> None:
    parser = build_parser()
    defaults = config_from_args(parser.parse_args(["serve"]))
    assert (defaults.max_n, defaults.max_request_body_bytes) == (16, 8 * 2**20)
    custom = config_from_args(parser.parse_args(["serve", "--max-n", "4", "--max-request-body-bytes", "1000"]))
    assert (custom.max_n, custom.max_request_body_bytes) == (4, 1000)


def test_operations_flags_default_and_override() -> None:
    parser = build_parser()
    defaults = config_from_args(parser.parse_args(["serve"]))
    assert defaults.api_keys == ()
    assert (defaults.max_num_queued_requests, defaults.request_timeout_s) == (256, None)
    assert (defaults.shutdown_timeout_s, defaults.sse_keepalive_s) == (30.0, 15.0)
    assert defaults.max_num_in_flight == 64 + 256
    custom = config_from_args(parser.parse_args([
        "serve", "--api-key", "a", "--api-key", "b", "--metrics-auth", "--max-num-queued-requests", "0",
        "--request-timeout", "2.5", "--shutdown-timeout", "0", "--sse-keepalive", "0", "--max-num-seqs", "3",
    ]))
    assert custom.api_keys == ("a", "b") and custom.is_metrics_auth
    assert (custom.max_num_in_flight, custom.request_timeout_s, custom.shutdown_timeout_s) == (3, 2.5, 0.0)
    shared = config_from_args(parser.parse_args(["serve", "--api-server-count", "3", "--max-num-queued-requests", "8"]))
    assert shared.max_num_in_flight == (64 + 8) // 3


def test_every_serve_flag_reads_its_variable_and_the_flag_beats_it() -> None:
    environ = {
        "ZEROSERVE_MODEL": "m.gguf", "ZEROSERVE_PORT": "9001", "ZEROSERVE_API_KEY": "k1, k2",
        "ZEROSERVE_ENABLE_PREFIX_CACHING": "0",
        "ZEROSERVE_METRICS_AUTH": "true", "ZEROSERVE_REQUEST_TIMEOUT": "7", "ZEROSERVE_SCHEDULING_POLICY": "priority",
        "ZEROSERVE_SERVED_MODEL_NAME": "a,b", "ZEROSERVE_OVERRIDE_GENERATION_CONFIG": '{"temperature": 0.5}',
    }
    config = config_from_args(parse_serve_args(["serve"], environ))
    assert (config.model, config.port, config.api_keys) == ("m.gguf", 9001, ("k1", "k2"))
    assert config.engine.enable_prefix_caching is False and config.is_metrics_auth
    assert (config.request_timeout_s, config.engine.scheduling_policy) == (7.0, "priority")
    assert config.served_model_names == ("a", "b")
    assert config.generation_config == (("temperature", 0.5),)
    flags = config_from_args(parse_serve_args(["serve", "x.gguf", "--port", "9002", "--api-key", "k3"], environ))
    assert (flags.model, flags.port, flags.api_keys) == ("x.gguf", 9002, ("k3",))


@pytest.mark.parametrize("command", ENV_COMMANDS, ids=" ".join)
def test_every_command_that_starts_an_engine_reads_the_same_variables(
    command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    environ = {"ZEROSERVE_DTYPE": "float32", "ZEROSERVE_MAX_NUM_SEQS": "7", "ZEROSERVE_MODEL": "m.gguf"}
    required = ["--input", "in.jsonl", "--output", "out.jsonl"] if command == ("generate",) else ["--gateway", "tcp://h:1"] * (command == ("engine",))
    args = parse_serve_args([*command, *required], environ)
    config = engine_config_from(args)
    # NOTE: serve takes several models (a list), the other commands one.
    models = args.model if isinstance(args.model, list) else [args.model]
    assert (config.dtype, config.max_num_seqs, models) == ("float32", 7, ["m.gguf"])
    flags = engine_config_from(parse_serve_args([*command, *required, "--dtype", "bfloat16"], environ))
    assert (flags.dtype, flags.max_num_seqs) == ("bfloat16", 7)
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args([*command, *required], {"ZEROSERVE_DTYPE": "float8"})
    assert exit_info.value.code == 2 and "ZEROSERVE_DTYPE" in capsys.readouterr().err
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        parse_serve_args([*command, "--help"], {})
    text = " ".join(capsys.readouterr().out.split())
    assert "[env: ZEROSERVE_DTYPE]" in text and "[env: ZEROSERVE_MAX_NUM_SEQS]" in text


@pytest.mark.parametrize(
    ("name", "value"),
    [("ZEROSERVE_PORT", "eighty"), ("ZEROSERVE_SSE_KEEPALIVE", "often"), ("ZEROSERVE_METRICS_AUTH", "maybe"),
     ("ZEROSERVE_DTYPE", "float8"), ("ZEROSERVE_API_KEY", " , ")],
)
def test_a_bad_variable_exits_2_naming_it(name: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve"], {name: value})
    assert exit_info.value.code == 2
    assert name in capsys.readouterr().err


def test_a_bad_flag_exits_2_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve", "--request-timeout", "soon"], {})
    assert exit_info.value.code == 2
    assert "--request-timeout" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["serve", "--max-num-seq=4"], "serve"),
        (["generate", "--input", "a", "--output", "b", "--max-in-fligth=2"], "generate"),
        (["bench", "serve", "--num-prompt=2"], "bench serve"),
        (["keys", "generate", "--dir", "k", "--nmae=x"], "keys generate"),
    ],
)
def test_a_misspelt_flag_gets_its_commands_usage_and_error(
    argv: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(argv, {})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: zeroserve {command} "), err
    assert err.splitlines()[-1] == f"zeroserve {command}: error: unrecognized arguments: {argv[-1]}"


@pytest.mark.parametrize(
    ("argv", "environ", "named"),
    [
        (["serve", "--max-num-queued-requests", "-1"], {}, "--max-num-queued-requests"),
        (["serve"], {"ZEROSERVE_MAX_NUM_QUEUED_REQUESTS": "-1"}, "ZEROSERVE_MAX_NUM_QUEUED_REQUESTS"),
        (["serve", "--request-timeout", "0"], {}, "--request-timeout"),
        (["serve"], {"ZEROSERVE_SHUTDOWN_TIMEOUT": "-5"}, "ZEROSERVE_SHUTDOWN_TIMEOUT"),
    ],
)
def test_an_out_of_range_value_exits_2_naming_the_flag_or_variable(
    argv: list[str], environ: dict[str, str], named: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    assert named in capsys.readouterr().err


def test_help_shows_each_flag_default_and_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        parse_serve_args(["serve", "--help"], {})
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in [("--max-num-queued-requests", "256"), ("--shutdown-timeout", "30.0"),
                          ("--sse-keepalive", "15.0"), ("--port", "8000"), ("--dtype", "auto")]:
        variable = "ZEROSERVE_" + flag[2:].replace("-", "_").upper()
        line = text[text.index(f"{flag} "):text.index(f"[env: {variable}]")]
        assert f"(default: {default})" in line
    assert "[env: ZEROSERVE_MODEL]" in text and "[env: ZEROSERVE_API_KEY]" in text
    variables = [envs.flag_var_name(action) for action in envs.flag_actions(serve_parser())]
    assert all(f"[env: {variable}]" in text for variable in variables)
    assert len(set(variables)) == len(variables) and not set(variables) & set(envs.ENV_VARS)


def serve_parser() -> argparse.ArgumentParser:
    (commands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    parser: argparse.ArgumentParser = commands.choices["serve"]
    return parser


@pytest.mark.parametrize("argv", [["serve", "--max-num-seq", "4"], ["bench", "serve", "--num-prompt", "3"],
                                  ["generate", "-i", "in.jsonl", "-o", "out.jsonl", "--max-in", "4"]])
def test_an_abbreviated_flag_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(argv, {})
    assert exit_info.value.code == 2
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "expected"), [("--max-num-seqs", "a whole number"), ("--kv-cache-memory", "a number")])
def test_a_flag_that_is_not_a_number_says_what_it_wants(
    flag: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_serve_args(["serve", flag, "abc"], {})
    assert exit_info.value.code == 2
    assert f"argument {flag}: expected {expected}, got 'abc'" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["serve"], ["generate"], ["engine"], ["bench", "serve"], ["bench", "throughput"],
                                     ["keys", "generate"]])
def test_help_writes_each_default_once_as_a_user_would(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    with pytest.raises(SystemExit):
        parse_serve_args([*command, "--help"], {})
    text = " ".join(capsys.readouterr().out.split())
    for python_value in ("(default: None)", "(default: True)", "(default: False)", "(default: )"):
        assert python_value not in text
    flags = text.split("options:", 1)[1].split(" -")
    assert not [flag for flag in flags if flag.count("default:") > 1]
    if command == ["serve"]:
        assert "--engine-restart, --no-engine-restart" in text and "engine stays lost) (default: on)" in text
        assert "(with --curve-secret-key) (default: unset)" in text
