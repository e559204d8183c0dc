"""The default model, default flags, on CPUs this machine is not: QEMU's user mode presents an
AVX2-only Haswell and a Nehalem with none of the fast paths to torch (and to oneDNN), in process.

The greedy tokens must be the native run's: the emulated CPU picks other matmul forms (int8 or
float32 where oneDNN has no bfloat16, float32 activations without AVX2), so this also checks
that they all answer the same on a prompt whose answer is clear.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.emulated_generate import PROMPT

QEMU = shutil.which("qemu-x86_64")
ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates x86 CPUs (this machine is not x86_64)"),
    pytest.mark.skipif(QEMU is None, reason="needs qemu-user (apt-get install qemu-user; .ci/run installs it)"),
]


def generate(*wrapper: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [*wrapper, sys.executable, "-m", "tests.emulated_generate"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))


@pytest.fixture(scope="module")
def native(default_model_path: Path) -> dict[str, object]:
    return generate()


@pytest.mark.parametrize(("cpu", "capability"), [("Haswell", "AVX2"), ("Nehalem", "DEFAULT")])
def test_an_emulated_cpu_generates_the_native_greedy_tokens(
    native: dict[str, object], cpu: str, capability: str
) -> None:
    assert QEMU is not None
    emulated = generate(QEMU, "-cpu", cpu)
    assert f"x86_64 {capability}" in str(emulated["cpu"])
    assert emulated["token_ids"] == native["token_ids"], (PROMPT, emulated["text"], native["text"], emulated["kernels"])
