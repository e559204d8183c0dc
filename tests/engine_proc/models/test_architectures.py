"""Each architecture, as a Hugging Face folder and as the F32 GGUF llama.cpp's converter makes of it:
in float32, zeroserve's greedy tokens equal transformers', token for token."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.model_files.tokenizer import Tokenizer
from tests.engine_proc.models.reference_models import (
    ARCHITECTURES,
    convert_to_gguf,
    engine_greedy,
    transformers_greedy,
    write_hf_folder,
)

MAX_NEW_TOKENS = 12
TEXTS = ["The capital of France is", "def fib(n):\n    return", "Once upon a time, in a land far away,"]


@pytest.fixture(scope="module")
def tokenizer(default_model_path: Path) -> Tokenizer:
    return Tokenizer.from_model(default_model_path)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model_files(
    request: pytest.FixtureRequest, tokenizer: Tokenizer, llama_cpp_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, list[list[int]]]:
    """(folder, its F32 GGUF, transformers' greedy tokens for TEXTS)."""
    root = tmp_path_factory.mktemp(request.param)
    folder = write_hf_folder(root / request.param, request.param, tokenizer)
    gguf_path = convert_to_gguf(folder, root / f"{request.param}-f32.gguf", llama_cpp_tree)
    prompts = [tokenizer.encode(text) for text in TEXTS]
    return folder, gguf_path, transformers_greedy(folder, prompts, MAX_NEW_TOKENS)


def test_folder_greedy_equals_transformers(model_files: tuple[Path, Path, list[list[int]]], tokenizer: Tokenizer) -> None:
    folder, _, expected = model_files
    prompts = [tokenizer.encode(text) for text in TEXTS]
    assert engine_greedy(folder, prompts, MAX_NEW_TOKENS, dtype="float32") == expected


def test_f32_gguf_greedy_equals_transformers(model_files: tuple[Path, Path, list[list[int]]], tokenizer: Tokenizer) -> None:
    _, gguf_path, expected = model_files
    prompts = [tokenizer.encode(text) for text in TEXTS]
    assert engine_greedy(gguf_path, prompts, MAX_NEW_TOKENS, dtype="float32") == expected
