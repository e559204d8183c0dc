"""A model zeroserve cannot serve ends `zeroserve serve`, `zeroserve generate` and `LLM(...)` with one
line naming what is unsupported and what is (exit status 2, no traceback), case by case."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from proto.model_support import UnsupportedModel
from tests.small_model_files import with_tensor_type, write_gguf, write_hf_folder

CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "architecture": (lambda tmp: write_gguf(tmp / "m.gguf", arch="mamba"), "architecture 'mamba' is not supported"),
    "tokenizer": (lambda tmp: write_gguf(tmp / "m.gguf", tokenizer="rwkv"), "tokenizer 'rwkv' is not supported"),
    "tensor type": (
        lambda tmp: with_tensor_type(write_gguf(tmp / "m.gguf"), "blk.0.attn_norm.weight", 250),
        "has ggml type 250, which is not supported",
    ),
    "folder architecture": (
        lambda tmp: write_hf_folder(tmp / "m", model_type="mamba"),
        "model_type 'mamba' is not supported",
    ),
}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("case", CASES)
def test_serve_refuses_in_one_line_with_status_2(tmp_path: Path, case: str) -> None:
    make, named = CASES[case]
    result = _run("serve", str(make(tmp_path)), "--port", "0")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("zeroserve: error: ") and named in last_line and "supported: " in last_line


@pytest.mark.parametrize("case", CASES)
def test_generate_refuses_in_one_line_with_status_2(tmp_path: Path, case: str) -> None:
    make, named = CASES[case]
    (tmp_path / "in.jsonl").write_text('{"custom_id": "a", "body": {"prompt": "hi"}}\n')
    result = _run("generate", str(make(tmp_path)), "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.jsonl"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert result.stderr.startswith("zeroserve generate: error: ") and named in result.stderr


@pytest.mark.parametrize("case", CASES)
def test_llm_refuses_before_starting_an_engine(tmp_path: Path, case: str) -> None:
    from service.frontend.llm import LLM

    make, named = CASES[case]
    with pytest.raises(UnsupportedModel, match=named) as caught:
        LLM(str(make(tmp_path)))
    assert "\n" not in str(caught.value) and "supported: " in str(caught.value)


def test_a_port_in_use_is_one_line_with_status_2() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = _run("serve", "--port", str(port))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"zeroserve: error: cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port"
    )
