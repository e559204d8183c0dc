"""EngineCore on a tiny random model: batching, chunking and preemption never change greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_proc.config import EngineConfig
from engine_proc.core import EngineCore
from proto.engine_input import EngineCoreRequest, SamplingParams
from proto.engine_output import FinishReason

PROMPTS = [list(range(100 + i, 100 + i + n)) for i, n in enumerate([3, 17, 40, 5, 64, 1])]


def generate(core: EngineCore, prompts: list[list[int]], max_tokens: int = 12) -> list[list[int]]:
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work:
        for output in core.step().outputs:
            outputs[output.request_id] += output.new_token_ids
    return [outputs[str(i)] for i in range(len(prompts))]


@pytest.fixture(scope="module")
def solo_outputs(tiny_model_dir: Path) -> list[list[int]]:
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05))
    return [generate(core, [prompt])[0] for prompt in PROMPTS]


def test_batched_requests_produce_what_each_produces_alone(
    tiny_model_dir: Path, solo_outputs: list[list[int]]
) -> None:
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05))
    assert generate(core, PROMPTS) == solo_outputs
    assert core.scheduler.kv_cache_manager.num_free_blocks == core.scheduler.kv_cache_manager.num_blocks


def test_chunked_prefill_and_preemption_do_not_change_tokens(
    tiny_model_dir: Path, solo_outputs: list[list[int]]
) -> None:
    # A 16-token budget chunks the longer prompts; 12 blocks of 16 force preemptions.
    config = EngineConfig(model_path=str(tiny_model_dir), max_num_batched_tokens=16,
                          kv_cache_memory_gib=12 * (2 * 2 * 16 * 2 * 16 * 4) / 2**30, max_model_len=128)
    core = EngineCore(config)
    assert core.scheduler.kv_cache_manager.num_blocks == 12
    assert generate(core, PROMPTS) == solo_outputs
    assert core.scheduler.num_preemptions > 0
    assert core.scheduler.kv_cache_manager.num_free_blocks == 12


def test_too_long_prompt_is_refused_without_stopping_the_engine(tiny_model_dir: Path) -> None:
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05, max_model_len=32))
    core.add_request(EngineCoreRequest("long", list(range(40)), SamplingParams()))
    (output,) = core.step().outputs
    assert output.finish_reason is FinishReason.ERROR
    assert generate(core, [[1, 2, 3]], max_tokens=2)[0] != []
