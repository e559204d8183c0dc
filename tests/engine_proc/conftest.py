"""Fixtures of the fidelity tests: the test questions as chat prompts and transformers' answers."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.engine_proc.fidelity_prompts import MAX_NEW_TOKENS, QUESTIONS


@pytest.fixture(scope="session")
def chat_prompts(default_model_path: Path) -> list[list[int]]:
    """Each fidelity question rendered with the default model's chat template and encoded."""
    from service.model_files.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_model(default_model_path)
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]


@pytest.fixture(scope="session")
def reference_tokens(
    default_model_path: Path, hf_reference_model: object, chat_prompts: list[list[int]]
) -> list[list[int]]:
    """transformers' greedy continuation of each chat prompt (float32, the same GGUF)."""
    import torch

    from service.model_files.tokenizer import Tokenizer

    eos_token_id = Tokenizer.from_model(default_model_path).eos_token_id
    expected = []
    for prompt in chat_prompts:
        with torch.no_grad():
            generated = hf_reference_model.generate(  # type: ignore[attr-defined]
                torch.tensor([prompt]), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                eos_token_id=eos_token_id, pad_token_id=eos_token_id,
            )
        expected.append(generated[0, len(prompt):].tolist())
    return expected
