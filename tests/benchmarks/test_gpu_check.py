"""benchmarks/gpu_check.py without a GPU: its help, a dry run that finds every file, module and flag
it uses, and a run that stops at phase 0 when torch sees no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import PYTEST_ARGS, PYTEST_ENV, ROOT, Step, check_step

pytestmark = pytest.mark.slow  # NOTE: each check runs the commands' --help, or pytest's collection


def gpu_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
    )


def test_help_names_the_phases_and_the_dry_run() -> None:
    result = gpu_check("--help")
    assert result.returncode == 0, result.stderr
    for text in ("--dry-run", "--skip-install", "tests/engine_proc/test_cuda.py", "benchmarks.reference_compare"):
        assert text in result.stdout


def test_dry_run_finds_every_file_module_and_flag_the_run_uses() -> None:
    result = gpu_check("--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"{phase}: ok" for phase in ("install", "test_cuda", "bench", "sdk", "serve")]


def test_dry_run_names_a_missing_test_file_and_an_unknown_flag() -> None:
    missing_file = Step("pytest", (*PYTEST_ARGS, "tests/service/openai/test_openai_sdk.py"), "sdk.log", 1, PYTEST_ENV)
    assert "tests/service/openai/test_openai_sdk.py not found" in check_step(missing_file)
    unknown_flag = Step("benchmarks.reference_compare", ("--device", "cuda", "--gpu-count", "1"), "bench.log", 1)
    assert check_step(unknown_flag) == ["python -m benchmarks.reference_compare has no flag --gpu-count"]
    assert check_step(Step("benchmarks.gpu_check_sh", (), "x.log", 1)) == ["module benchmarks.gpu_check_sh not found"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the run would go on")
def test_without_a_gpu_the_run_stops_at_phase_0_and_says_why(tmp_path: Path) -> None:
    result = gpu_check(str(tmp_path), "--skip-install")
    assert result.returncode == 1
    assert "torch sees no GPU" in result.stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert list(summary) == ["install"]
    assert summary["install"]["status"] == "failed (exit status 1)"
    assert (tmp_path / "install.log").read_text() == "torch sees no GPU, and --skip-install\n"
    assert not (tmp_path / "machine.txt").exists()
