"""Every command the README prints, run as printed in a fresh clone of this checkout on the default
model: `make serve` (stopped with Ctrl-C, as a user does), then each ```bash and ```python block in
order, each checked for what a reader would see; the clone's `git status` is clean after all of it.

The one block not run is `make test`: it is this suite."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engine_proc.cpu.kernels import build_root
from proto import envs
from tests.server_process import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "ARGS", "PORT", "HOST", "MODEL", "PYTHON")
PORT = "8000"  # NOTE: the port the README's commands use; the test gives each server a free one.

pytestmark = [
    pytest.mark.real_model,
    pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs this project's git checkout to clone"),
]


@dataclass(frozen=True)
class Block:
    """One fenced block of the README."""

    language: str
    text: str

    @property
    def starts_a_server(self) -> bool:
        pattern = r"^(\.venv/bin/)?zeroserve serve\b|^make serve\b"
        return self.language == "bash" and bool(re.search(pattern, self.text, re.MULTILINE))


def readme_blocks() -> list[Block]:
    return [Block(language, text) for language, text in FENCE.findall(README.read_text())]


# NOTE: what a reader sees from each block (by a line of it): a block not listed here must still
# exit 0 (and a listed one that is no longer in the README fails the test).
EXPECTED_OUTPUT = {  # regular expressions
    "curl -N http://127.0.0.1:8000/v1/chat/completions": [r"data: \[DONE\]", "Tokyo"],
    "from openai import OpenAI": ["Tokyo", "Paris"],
    "zeroserve serve all-minilm-l6-v2": [r'"results":\[\{"index":1,', r"(?m)^384 13$"],
    "curl -s http://127.0.0.1:8000/version": ['"version"', '"kernels"'],
    "from service import LLM, SamplingParams": ["The capital of France is → .*Paris", "Tokyo"],
    "response_format=Answer": [r"city='Tokyo'"],
    "client.responses.create(": ["The capital of Japan is Tokyo"],
    "curl -s http://127.0.0.1:8000/v1/messages": ['"stop_reason":"end_turn"', "The capital of Japan is Tokyo"],
    "--result-json out.json": [r"Successful requests: +16\s"],
    "/v1/streams/fox-1": [r"(?m)^id: 1\n", r"(?m)^id: 2\n", r"data: \[DONE\]"],
}
EXPECTED_FILES = {
    ".venv/bin/zeroserve generate": ["prompts.jsonl", "results.jsonl"],
    "--result-json out.json": ["out.json"],
    "keys generate --dir ~/.config/zeroserve/keys": [
        "home/.config/zeroserve/keys/gateway.key_secret", "home/.config/zeroserve/keys/engine-1.key",
    ],
}


def test_every_block_says_what_it_is() -> None:
    blocks = readme_blocks()
    assert blocks and all(block.language in ("bash", "python", "text") for block in blocks), [
        block.text[:60] for block in blocks if block.language not in ("bash", "python", "text")
    ]
    texts = "\n".join(block.text for block in blocks if block.language != "text")
    assert all(key in texts for key in [*EXPECTED_OUTPUT, *EXPECTED_FILES])


def test_the_readmes_commands_run_as_printed_and_leave_a_fresh_clone_clean(
    default_model_path: Path, tmp_path: Path
) -> None:
    clone = tmp_path / "zeroserve"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    # NOTE: the suite's own environment stands in for the one `make serve` would build; the
    # clone's pyproject.toml is made older than its install marker, so make reinstalls nothing.
    (clone / ".venv").symlink_to(ROOT / ".venv")
    os.utime(clone / "pyproject.toml", (0, 0))
    home = tmp_path / "home"
    home.mkdir()
    # NOTE: not the variables of a `make test ARGS=...` that runs this suite: make passes them on
    # (in MAKEFLAGS and as variables) to the README's `make serve`.
    outer = {name: value for name, value in os.environ.items() if name not in MAKE_VARIABLES}
    env = {
        **outer, "HOME": str(home), "ZEROSERVE_CACHE": str(envs.cache_dir()), "PYTHONUNBUFFERED": "1",
        # NOTE: the C++ kernels this machine already built (HOME is the test's own).
        "TORCH_EXTENSIONS_DIR": str(build_root()),
    }
    first, *rest = [block for block in readme_blocks() if block.language != "text"]
    assert first.text.splitlines()[0].startswith("make serve") and first.text.splitlines()[1].startswith("make test")
    port = free_port()
    with serving(f"make serve PORT={port}", clone, env, port, tmp_path / "make-serve.log"):
        for block in rest:
            run(block, clone, env, port, tmp_path)
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == "", status.stdout


def run(block: Block, clone: Path, env: dict[str, str], port: int, tmp_path: Path) -> None:
    """Runs one block (a server it starts on a port of its own) and checks what it printed and wrote."""
    own_port = free_port() if block.starts_a_server else port
    text = block.text.replace(f":{PORT}", f":{own_port}").replace(f"--port {PORT}", f"--port {own_port}")
    if block.starts_a_server and "&" not in text:
        # NOTE: a lone `zeroserve serve ...`: served, asked once, stopped with Ctrl-C.
        with serving(f"{text.strip()} --port {own_port}", clone, env, own_port, tmp_path / "serve.log") as base_url:
            body = {"prompt": "The capital of France is", "max_tokens": 8}
            assert "Paris" in httpx.post(f"{base_url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        return
    command = [sys.executable, "-c", text] if block.language == "python" else ["bash", "-euo", "pipefail", "-c", text]
    # NOTE: output to a file, not a pipe: a server the block left in the background keeps its
    # stdout open after the block is done.
    log_file = tmp_path / "block.log"
    with log_file.open("w") as log:
        proc = subprocess.Popen(command, cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    try:
        proc.wait(timeout=600)
    finally:
        _stop_group(proc)
    output = log_file.read_text()
    print(f"{time.monotonic() - started:6.1f} s  {text.splitlines()[0]}")
    assert proc.returncode == 0, f"{text}\n---\n{output[-3000:]}"
    for key, expected in EXPECTED_OUTPUT.items():
        if key in block.text:
            assert all(re.search(pattern, output) for pattern in expected), f"{text}\n---\n{output[-3000:]}"
    for key, paths in EXPECTED_FILES.items():
        if key in block.text:
            assert all((clone / path).is_file() or (tmp_path / path).is_file() for path in paths), (key, paths)


@contextmanager
def serving(command: str, cwd: Path, env: dict[str, str], port: int, log_file: Path) -> Iterator[str]:
    """Runs a server command as a shell would (its own process group), yields its URL once
    /health is 200, and stops it with a Ctrl-C to the group."""
    base_url = f"http://127.0.0.1:{port}"
    with log_file.open("w") as log:
        proc = subprocess.Popen(
            ["bash", "-c", command], cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = time.monotonic()
    try:
        deadline = started + 300
        while not _is_healthy(base_url):
            assert proc.poll() is None and time.monotonic() < deadline, log_file.read_text()[-3000:]
            time.sleep(0.5)
        print(f"{time.monotonic() - started:6.1f} s  until healthy: {command}")
        yield base_url
    finally:
        _stop_group(proc)
    assert not _is_healthy(base_url)


def _is_healthy(base_url: str) -> bool:
    try:
        return httpx.get(f"{base_url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C to the process group (a server left in the background included), then waits for all of it."""
    try:
        os.killpg(proc.pid, signal.SIGINT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        # NOTE: reaps the leader once it exits: a zombie still counts as a member of its group.
        proc.poll()
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_first_make_serve_says_what_it_is_doing_before_each_long_step(tmp_path: Path) -> None:
    """A fresh clone's `make serve` installs, fetches and builds for minutes: each step is announced first."""
    clone = tmp_path / "zeroserve"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    env = {name: value for name, value in os.environ.items() if name not in MAKE_VARIABLES}
    plan = subprocess.run(["make", "-n", "serve"], cwd=clone, env=env, capture_output=True, text=True, check=True)
    lines = plan.stdout.splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    assert first("make: installing torch") < first("pip install --quiet torch")
    assert first("make: fetching the default model") < first("resolve_model(")
    assert first("make: building zeroserve's C++ kernels") < first("load_cpu_kernels()")
