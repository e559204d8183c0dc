"""The default model, default flags, on CPUs this machine is not: QEMU's user mode presents an
AVX2-only Haswell to torch (and to oneDNN) for an engine process that serves a gateway; torch's
and oneDNN's overrides stand in for a CPU with none of the fast paths (`LLM` in process).

The greedy tokens must be the native run's: the other CPUs pick other matmul forms (int8 or
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
import torch

from benchmarks.real_size_ggufs import Shape, write
from proto.engine_config import EngineConfig
from service.client.engine_launcher import engine_argv
from service.model_files.model_registry import DEFAULT_MODEL
from tests.emulated_generate import NUM_TOKENS, PROMPT
from tests.server_process import free_engine_port, is_healthy, running_server

QEMU = shutil.which("qemu-x86_64")
ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="x86 CPUs (this machine is not x86_64)"),
]
needs_qemu = pytest.mark.skipif(QEMU is None, reason="needs qemu-user (apt-get install qemu-user; .ci/run installs it)")


def generate(*wrapper: str, **overrides: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONWARNINGS": "ignore", **overrides}
    result = subprocess.run(
        [*wrapper, sys.executable, "-m", "tests.emulated_generate"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(result.stdout))


@pytest.fixture(scope="module")
def native(default_model_path: Path) -> dict[str, object]:
    return generate()


def test_a_cpu_with_none_of_the_fast_paths_generates_the_native_greedy_tokens(native: dict[str, object]) -> None:
    # NOTE: torch's and oneDNN's own overrides stand in for a pre-AVX2 CPU at native speed (QEMU's
    # Nehalem took a quarter of an hour for these six tokens): torch's kernels and ours see
    # DEFAULT, oneDNN goes no further than SSE4.1.
    plain = generate(ATEN_CPU_CAPABILITY="default", ONEDNN_MAX_CPU_ISA="SSE41")
    assert str(plain["cpu"]).endswith("x86_64 DEFAULT")
    kernels = dict(plain["kernels"])  # type: ignore[call-overload]
    assert kernels["linears"] == kernels["head"] == "dense" and kernels["norms"] == "torch ops", kernels
    assert plain["token_ids"] == native["token_ids"], (PROMPT, plain["text"], native["text"], plain["kernels"])


@needs_qemu
def test_a_gateway_serves_the_native_greedy_tokens_from_the_default_model_on_an_emulated_avx2_cpu(
    native: dict[str, object], default_model_path: Path, tmp_path: Path
) -> None:
    # NOTE: qemu-user does not follow a child process, so the engine runs under it on its own
    # (default flags; a small KV cache only because zeroing the default 4 GiB takes minutes under
    # emulation) and joins the gateway as a remote engine does.
    assert QEMU is not None
    engine_port = free_engine_port()
    engine = EngineConfig(model_path=str(default_model_path), model_name=DEFAULT_MODEL, max_model_len=2048, kv_cache_memory_gib=0.25)
    argv = engine_argv(engine, -1, f"tcp://127.0.0.1:{engine_port}", f"tcp://127.0.0.1:{engine_port + 1}")
    with running_server(
        DEFAULT_MODEL, "--data-parallel-size", "0", "--engine-address", f"tcp://127.0.0.1:{engine_port}",
        wait_healthy=False,
    ) as server:
        log = tmp_path / "engine.log"
        with log.open("w") as stderr:
            proc = subprocess.Popen(
                [QEMU, "-cpu", "Haswell", sys.executable, "-m", "engine_proc", *argv, "--headless"],
                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "PYTHONWARNINGS": "ignore"},
            )
        try:
            # NOTE: readiness, not a fixed wait: the gateway answers 503 until the emulated engine joins
            # (minutes under QEMU, more on a busy machine); only the engine's exit ends the wait early.
            deadline = time.monotonic() + 1800
            while not is_healthy(server):
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(2)
            version = httpx.get(f"{server.base_url}/version", timeout=60).json()
            assert "x86_64 AVX2" in version["cpu"], version
            body = {"prompt": PROMPT, "max_tokens": NUM_TOKENS, "temperature": 0, "ignore_eos": True,
                    "return_token_ids": True}
            response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=1800)
            assert response.status_code == 200, response.text
            (choice,) = response.json()["choices"]
            assert response.json()["usage"]["completion_tokens"] == NUM_TOKENS
            assert choice["token_ids"] == native["token_ids"], (PROMPT, choice["text"], native["text"], version)
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@needs_qemu
def test_the_k_quant_forms_give_the_native_logits_on_an_emulated_avx2_cpu(tmp_path: Path) -> None:
    # NOTE: a small model in a k-quant mix as llama-quantize makes them (Q4_K, Q5_K, Q6_K beside Q5_0),
    # each fused projection's parts of one type (parts of two types are held as Q8_0 blocks),
    # its head from the Q6_K embedding; on an AVX-512 machine this is where the AVX2 bodies run at all.
    path = tmp_path / "small-k-quants.gguf"
    types = {kind: "Q5_K" for kind in ("attn_q", "attn_k", "attn_v")}
    types |= {"attn_output": "Q5_0", "ffn_down": "Q6_K", "token_embd": "Q6_K"}
    write(Shape(256, 2, 512, 4, 2, 64, is_tied=True), "Q4_K", path, types=types)

    def logits(*wrapper: str) -> tuple[dict[str, object], torch.Tensor]:
        out = tmp_path / f"logits-{len(wrapper)}.pt"
        result = subprocess.run(
            [*wrapper, sys.executable, "-m", "tests.emulated_logits", str(path), str(out)],
            cwd=ROOT, env={**os.environ, "PYTHONWARNINGS": "ignore"}, capture_output=True, text=True, timeout=900,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return dict(json.loads(result.stdout.strip().splitlines()[-1])), torch.load(out)

    assert QEMU is not None
    native, native_logits = logits()
    emulated, emulated_logits = logits(QEMU, "-cpu", "Haswell")
    assert "x86_64 AVX2" in str(emulated["cpu"]), emulated
    assert {"int4k_q8", "int5k_q8", "int6k_q8", "int5_q8"} <= set(emulated["forms"]), emulated  # type: ignore[call-overload]
    assert emulated["forms"] == native["forms"]
    if "x86_64 AVX2" in str(native["cpu"]):
        assert torch.equal(emulated_logits, native_logits)
    else:
        # NOTE: the AVX-512 bodies make the same integer sums and float32 steps; the ops between (torch's) may differ.
        assert (emulated_logits - native_logits).abs().max() <= 1e-2 * native_logits.abs().max()
