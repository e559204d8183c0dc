"""A model zeroserve cannot serve ends `zeroserve serve`, `zeroserve generate` and `LLM(...)` with one
line naming what is unsupported and what is, or what is wrong with the file (exit status 2, no traceback),
case by case."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from proto.model_support import UnsupportedModel
from tests.small_model_files import cut_short, with_tensor_type, write_gguf, write_hf_folder

CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "architecture": (lambda tmp: write_gguf(tmp / "m.gguf", arch="mamba"), "architecture 'mamba' is not supported"),
    "tokenizer": (lambda tmp: write_gguf(tmp / "m.gguf", tokenizer="rwkv"), "tokenizer 'rwkv' is not supported"),
    "tensor type": (
        lambda tmp: with_tensor_type(write_gguf(tmp / "m.gguf"), "blk.0.attn_norm.weight", 250),
        "has ggml type 250, which is not supported",
    ),
    "tensor type without a conversion": (
        lambda tmp: with_tensor_type(write_gguf(tmp / "m.gguf"), "blk.0.attn_norm.weight", GGMLQuantizationType.I32),
        "has ggml type 26 (I32), which is not supported",
    ),
    "experts": (
        lambda tmp: write_gguf(
            tmp / "m.gguf", arch="qwen2", metadata={"qwen2.expert_count": 8}, tensor_names=["blk.0.ffn_gate_exps.weight"]
        ),
        "m.gguf: mixture-of-experts layers (8 experts) are not supported for 'qwen2'",
    ),
    "folder architecture": (
        lambda tmp: write_hf_folder(tmp / "m", model_type="mamba"),
        "model_type 'mamba' is not supported",
    ),
    "cut in its header": (
        lambda tmp: cut_short(write_gguf(tmp / "m.gguf"), 100),
        "m.gguf is cut short: the file ends inside its header, at 100 bytes (an interrupted download?)",
    ),
    "cut in its tensors": (
        lambda tmp: cut_short(write_gguf(tmp / "m.gguf", num_tensors=2), 300),
        "m.gguf is cut short: its tensors need ",
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
    assert last_line.startswith("zeroserve: error: ") and named in last_line
    assert "supported: " in last_line or "cut short" in named


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
    with pytest.raises(UnsupportedModel, match=re.escape(named)) as caught:
        LLM(str(make(tmp_path)))
    assert "\n" not in str(caught.value)


def test_a_missing_path_is_no_such_file_with_status_2(tmp_path: Path) -> None:
    result = _run("serve", str(tmp_path / "gone.gguf"), "--port", "0")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(f"zeroserve: error: {tmp_path / 'gone.gguf'}: no such file")


def test_a_port_in_use_is_one_line_with_status_2() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = _run("serve", "--port", str(port))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"zeroserve: error: cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port"
    )
