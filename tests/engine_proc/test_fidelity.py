"""The real default model: our greedy tokens equal transformers' greedy tokens from the same GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_proc.core import EngineCore
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.model_files.tokenizer import Tokenizer
from tests.engine_proc.fidelity_prompts import MAX_NEW_TOKENS, NGRAM_DRAFTS


@pytest.mark.real_model
@pytest.mark.parametrize("speculative_config", ["", NGRAM_DRAFTS], ids=["plain", "ngram-drafts"])
def test_greedy_tokens_equal_transformers(
    default_model_path: Path, chat_prompts: list[list[int]], reference_tokens: list[list[int]],
    speculative_config: str,
) -> None:
    # All prompts in one batch: continuous batching (and drafts verified in it) must not change a greedy token.
    core = EngineCore(EngineConfig(
        model_path=str(default_model_path), dtype="float32", kv_cache_memory_gib=0.25, max_model_len=2048,
        speculative_config=speculative_config,
    ))
    for i, prompt in enumerate(chat_prompts):
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    ours: dict[str, list[int]] = {str(i): [] for i in range(len(chat_prompts))}
    while core.has_work:
        for output in core.step().outputs:
            ours[output.request_id] += output.new_token_ids
    assert [ours[str(i)] for i in range(len(chat_prompts))] == reference_tokens
    assert "Paris" in Tokenizer.from_model(default_model_path).decode(ours["0"])
    if speculative_config:
        assert core.get_stats().num_accepted_tokens > 0
