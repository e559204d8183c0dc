"""Mixture-of-experts layers with default flags (bfloat16, the experts on their kernel forms): a token's
answer does not depend on what shares its step, and the one C++ call a layer gives the bits of the loop
over experts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.reference_models import engine_greedy, write_hf_folder
from engine_proc.core import EngineCore
from engine_proc.cpu.kernels import load_cpu_kernels
from engine_proc.models.moe import SparseMoeBlock, route
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.model_files.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(load_cpu_kernels() is None, reason="the experts' kernel forms need zeroserve's C++ kernels")

TEXTS = [f"Question {i}: what is {i} plus {2 * i}? Answer:" for i in range(16)]
MAX_NEW_TOKENS = 10


@pytest.fixture(scope="module")
def moe_folder(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen3-MoE (8 experts, 2 a token) with the default model's vocabulary."""
    return write_hf_folder(tmp_path_factory.mktemp("moe") / "qwen3_moe", "qwen3_moe", Tokenizer.from_model(default_model_path))


@pytest.fixture(scope="module")
def prompts(moe_folder: Path) -> list[list[int]]:
    return [Tokenizer.from_model(moe_folder).encode(text) for text in TEXTS]


def test_route_picks_the_highest_probabilities_and_renormalises_where_asked() -> None:
    logits = torch.tensor([[0.0, 2.0, 1.0, -1.0]])
    weights, expert_ids = route(logits, 2, is_renormalised=True)
    assert expert_ids.tolist() == [[1, 2]] and weights.sum().item() == pytest.approx(1.0)
    raw, _ = route(logits, 2, is_renormalised=False)
    assert raw[0].tolist() == pytest.approx(logits.softmax(-1)[0, [1, 2]].tolist())


def test_each_answer_is_the_same_alone_and_beside_15_others(moe_folder: Path, prompts: list[list[int]]) -> None:
    """Default flags, the folder's projections rounded to Q8_0 at load: each of 16 greedy prompts gets the
    same tokens and the same logprob bits alone as in one batch of all 16 (different tokens choose
    different experts, so each step's experts hold different sets of tokens)."""
    batched = engine_greedy(moe_folder, prompts, MAX_NEW_TOKENS, quantization="q8_0")
    for index in (0, 7, 15):
        alone = engine_greedy(moe_folder, [prompts[index]], MAX_NEW_TOKENS, quantization="q8_0")
        assert alone.token_ids[0] == batched.token_ids[index]
        assert alone.logprobs[0] == batched.logprobs[index]


def test_the_fused_experts_give_the_loops_bits(
    moe_folder: Path, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    core = EngineCore(EngineConfig(model_path=str(moe_folder), quantization="q8_0", kv_cache_memory_gib=0.05, max_model_len=512))
    claims = core.ready_message().kernel_choices
    assert claims["experts"] == "one C++ call a layer (moe_experts)" and claims["batch invariant"] == "yes"
    fused = engine_greedy(moe_folder, prompts, MAX_NEW_TOKENS, quantization="q8_0")
    monkeypatch.setattr(SparseMoeBlock, "fuse", lambda self, kernels: None)
    looped = engine_greedy(moe_folder, prompts, MAX_NEW_TOKENS, quantization="q8_0")
    assert fused.token_ids == looped.token_ids and fused.logprobs == looped.logprobs


def test_a_long_prompt_prefilled_in_chunks_beside_decodes_runs_to_its_length(moe_folder: Path, prompts: list[list[int]]) -> None:
    """A 400-token prompt (its chunks route many tokens to each expert) beside three short ones."""
    core = EngineCore(EngineConfig(model_path=str(moe_folder), quantization="q8_0", kv_cache_memory_gib=0.05, max_model_len=512))
    long_prompt = sum(prompts, [])[:400]
    for index, prompt in enumerate([long_prompt, *prompts[:3]]):
        core.add_request(EngineCoreRequest(str(index), prompt, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)))
    counts: dict[str, int] = {}
    while core.has_work:
        for output in core.step().outputs:
            counts[output.request_id] = counts.get(output.request_id, 0) + len(output.new_token_ids)
    assert counts == {str(index): 4 for index in range(4)}
