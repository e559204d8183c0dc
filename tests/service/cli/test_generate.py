"""`zeroserve generate` takes `zeroserve serve`'s request settings, declared once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from service.cli.generate import _SERVE_SETTINGS
from service.cli.main import build_parser, main
from service.config import GatewayConfig
from service.flags.setting_flags import setting_values

FILES = ["--input", "in.jsonl", "--output", "out.jsonl"]


def test_defaults_are_serves_and_every_flag_sets_its_setting() -> None:
    parser = build_parser()
    served = setting_values(parser.parse_args(["serve"]), GatewayConfig, _SERVE_SETTINGS)
    assert setting_values(parser.parse_args(["generate", *FILES]), GatewayConfig, _SERVE_SETTINGS) == served
    args = parser.parse_args([
        "generate", *FILES, "--served-model-name", "mine", "--override-generation-config", '{"temperature": 0.5}',
        "--max-n", "3",
    ])
    assert setting_values(args, GatewayConfig, _SERVE_SETTINGS) == {
        "served_model_names": ("mine",), "generation_config": (("temperature", 0.5),), "max_n": 3,
    }


@pytest.mark.parametrize("flags", [["--max-n", "0"], ["--override-generation-config", '{"colour": 1}']])
def test_a_bad_value_exits_2_naming_the_flag(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["generate", *FILES, *flags])
    assert exited.value.code == 2
    assert flags[0] in capsys.readouterr().err


def test_a_rerun_with_every_line_done_says_so_and_starts_no_engine(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "in.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    done = '{"id": "r0", "custom_id": null}\n{"id": "r1", "custom_id": null}\n'
    (tmp_path / "out.jsonl").write_text(done)
    # NOTE: a model that does not exist: an engine started (or a model resolved) would fail the run.
    argv = ["generate", str(tmp_path / "absent.gguf"), "--input", str(tmp_path / "in.jsonl"),
            "--output", str(tmp_path / "out.jsonl")]
    with caplog.at_level(logging.INFO):
        assert main(argv) == 0
    assert (tmp_path / "out.jsonl").read_text() == done
    (line,) = [record.getMessage() for record in caplog.records if "nothing to run" in record.getMessage()]
    assert "every line of" in line and "out.jsonl" in line
