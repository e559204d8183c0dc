"""The default model, default flags, on CPUs this machine is not: QEMU's user mode presents an
AVX2-only Haswell and a Nehalem with none of the fast paths to torch (and to oneDNN): `LLM` in
process, and an engine process serving a gateway.

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
import time
from pathlib import Path

import httpx
import pytest

from proto.engine_config import EngineConfig
from service.client.engine_launcher import engine_argv
from service.model_files.model_registry import DEFAULT_MODEL, resolve_model
from tests.emulated_generate import NUM_TOKENS, QUESTION
from tests.server_process import free_port, running_server

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
    assert emulated["token_ids"] == native["token_ids"], (QUESTION, emulated["text"], native["text"], emulated["kernels"])


def test_a_gateway_serves_the_native_answer_from_an_engine_on_an_emulated_avx2_cpu(native: dict[str, object]) -> None:
    # NOTE: qemu-user does not follow a child process, so the engine runs under it on its own
    # and joins the gateway as a remote engine does.
    assert QEMU is not None
    resolved = resolve_model(DEFAULT_MODEL)
    engine_port = free_port()
    engine = EngineConfig(
        model_path=str(resolved.path), model_name=resolved.name, kv_cache_memory_gib=0.25, max_model_len=2048
    )
    argv = engine_argv(engine, -1, f"tcp://127.0.0.1:{engine_port}", f"tcp://127.0.0.1:{engine_port + 1}")
    with running_server(
        DEFAULT_MODEL, "--data-parallel-size", "0", "--engine-address", f"tcp://127.0.0.1:{engine_port}",
        wait_healthy=False,
    ) as server:
        proc = subprocess.Popen(
            [QEMU, "-cpu", "Haswell", sys.executable, "-m", "engine_proc", *argv, "--headless"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 900
            while httpx.get(f"{server.base_url}/health", timeout=5).status_code != 200:
                assert proc.poll() is None and time.monotonic() < deadline, "the emulated engine did not join"
                time.sleep(2)
            body = {"model": resolved.name, "messages": QUESTION, "max_tokens": NUM_TOKENS, "temperature": 0,
                    "ignore_eos": True}
            response = httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=600)
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"] == native["text"]
            assert "x86_64 AVX2" in httpx.get(f"{server.base_url}/version", timeout=5).json()["cpu"]
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
