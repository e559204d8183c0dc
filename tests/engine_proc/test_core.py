"""EngineCore on a tiny random model: batching, chunking and preemption never change greedy tokens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine_proc.core import EngineCore
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams, UtilityCall
from proto.engine_output import FinishReason

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [list(range(100 + i, 100 + i + n)) for i, n in enumerate([3, 17, 40, 5, 64, 1])]


def generate(
    core: EngineCore, prompts: list[list[int]], max_tokens: int = 12, max_tokens_of: list[int] | None = None
) -> list[list[int]]:
    """Greedy requests, all submitted at once; each one's tokens in input order."""
    for i, prompt in enumerate(prompts):
        num_tokens = max_tokens if max_tokens_of is None else max_tokens_of[i]
        params = SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True)
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


@pytest.mark.parametrize("max_num_batched_tokens", [2048, 16])
def test_ngram_drafts_change_no_greedy_token(
    tiny_model_dir: Path, solo_outputs: list[list[int]], max_num_batched_tokens: int
) -> None:
    # With a 16-token budget, decodes with drafts share steps with chunked prefills.
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
    config = EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05,
                          max_num_batched_tokens=max_num_batched_tokens, speculative_config=spec)
    core = EngineCore(config)
    assert generate(core, PROMPTS) == solo_outputs
    assert core.get_stats().num_accepted_tokens > 0  # the random model repeats itself
    # Prompts repeating a pattern the model does not follow: drafts that miss.
    patterned = [[7, 8, 9] * 6, [300, 301, 302, 303] * 4 + [300, 301]]
    plain = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05))
    before = core.get_stats()
    assert generate(core, patterned + PROMPTS[:2]) == generate(plain, patterned + PROMPTS[:2])
    stats = core.get_stats()
    assert stats.num_accepted_tokens - before.num_accepted_tokens < stats.num_draft_tokens - before.num_draft_tokens
    assert stats.num_free_blocks == core.scheduler.kv_cache_manager.num_blocks and stats.kv_cache_usage == 0.0


def test_drafting_requests_leave_their_batch_mates_unchanged(tiny_model_dir: Path) -> None:
    """A greedy request with drafts shares steps with logprobs, seeded-sampling and penalized requests."""
    requests = {
        "drafts": SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        "logprobs": SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, num_logprobs=2),
        "seeded": SamplingParams(temperature=0.9, seed=7, max_tokens=16, ignore_eos=True),
        "penalized": SamplingParams(temperature=0.0, presence_penalty=1.5, max_tokens=16, ignore_eos=True),
    }

    def run(speculative_config: str) -> tuple[dict[str, list[int]], list[object], int]:
        core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05,
                                       speculative_config=speculative_config))
        for request_id, params in requests.items():
            core.add_request(EngineCoreRequest(request_id, [7, 8, 9] * 4, params))
        tokens: dict[str, list[int]] = {request_id: [] for request_id in requests}
        logprobs: list[object] = []
        while core.has_work:
            for output in core.step().outputs:
                tokens[output.request_id] += output.new_token_ids
                if output.new_logprobs is not None:
                    logprobs.append(output.new_logprobs)
        return tokens, logprobs, core.get_stats().num_draft_tokens

    plain_tokens, plain_logprobs, _ = run("")
    tokens, logprobs, num_drafts = run('{"num_speculative_tokens": 3}')
    assert num_drafts > 0
    assert tokens == plain_tokens
    # NOTE: the same tokens and ranks; the values only within float32 rounding, since a batch of
    # another size may sum in another order (oneDNN's AVX2 kernels do).
    assert [(lp.token_ids, lp.ranks) for lp in logprobs] == [(lp.token_ids, lp.ranks) for lp in plain_logprobs]
    for drafted, plain in zip(logprobs, plain_logprobs, strict=True):
        assert drafted.logprobs == [pytest.approx(row, abs=1e-4) for row in plain.logprobs]


def test_too_long_prompt_is_refused_without_stopping_the_engine(tiny_model_dir: Path) -> None:
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05, max_model_len=32))
    core.add_request(EngineCoreRequest("long", list(range(40)), SamplingParams()))
    (output,) = core.step().outputs
    assert output.finish_reason is FinishReason.ERROR
    assert generate(core, [[1, 2, 3]], max_tokens=2)[0] != []


def mixed_prompts(num_prompts: int, shared_prefix: list[int]) -> list[list[int]]:
    """Prompts of 1 to ~90 tokens; every other one starts with `shared_prefix`."""
    prompts = []
    for i in range(num_prompts):
        own = [(37 * i + 11 * j) % 4000 + 10 for j in range(1 + (i * 7) % 53)]
        prompts.append(shared_prefix + own if i % 2 else own)
    return prompts


def generate_mixed(core: EngineCore, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy requests with output lengths of 1 to 24 tokens, all submitted at once."""
    return generate(core, prompts, max_tokens_of=[1 + (i * 5) % 24 for i in range(len(prompts))])


def test_32_concurrent_mixed_requests_match_each_alone_with_and_without_prefix_caching(
    tiny_model_dir: Path,
) -> None:
    prompts = mixed_prompts(32, shared_prefix=list(range(500, 540)))
    solo_core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05,
                                        enable_prefix_caching=False))
    alone = []
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=1 + (i * 5) % 24, ignore_eos=True)
        solo_core.add_request(EngineCoreRequest(str(i), prompt, params))
        tokens: list[int] = []
        while solo_core.has_work:
            tokens += [t for output in solo_core.step().outputs for t in output.new_token_ids]
        alone.append(tokens)
    for is_caching in (False, True):
        core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05,
                                       max_num_batched_tokens=256, enable_prefix_caching=is_caching))
        assert generate_mixed(core, prompts) == alone
        manager = core.scheduler.kv_cache_manager
        assert manager.num_free_blocks == manager.num_blocks
        if is_caching:
            assert manager.prefix_cache_hit_rate > 0
            assert generate_mixed(core, prompts) == alone  # again, now mostly from the cache


def test_reset_prefix_cache_utility(tiny_model_dir: Path) -> None:
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05))
    first = generate(core, [list(range(100, 150))], max_tokens=2)
    assert core.scheduler.kv_cache_manager.block_pool.num_cached_blocks > 0
    assert core.call_utility(UtilityCall(1, "reset_prefix_cache", [])).result is True
    assert core.scheduler.kv_cache_manager.block_pool.num_cached_blocks == 0
    assert generate(core, [list(range(100, 150))], max_tokens=2) == first


def test_priority_policy_serves_lower_priority_values_first(tiny_model_dir: Path) -> None:
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05,
                                   max_num_seqs=1, scheduling_policy="priority"))
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    for request_id, priority in [("batch", 9), ("chat", 0), ("batch-2", 9), ("urgent", -5)]:
        core.add_request(EngineCoreRequest(request_id, [5, 6, 7], params, priority=priority))
    finished = []
    while core.has_work:
        finished += [output.request_id for output in core.step().outputs if output.is_finished]
    assert finished == ["urgent", "chat", "batch", "batch-2"]


def test_out_of_vocabulary_ids_are_refused_and_a_replayed_request_id_is_dropped(tiny_model_dir: Path) -> None:
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05))
    greedy = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    core.add_request(EngineCoreRequest("ok", [1, 2, 3], greedy))
    core.add_request(EngineCoreRequest("bad-prompt", [1, 10**9], greedy))
    core.add_request(EngineCoreRequest("bad-bias", [1, 2], SamplingParams(logit_bias=[(-1, 5.0)])))
    core.add_request(EngineCoreRequest("ok", [9, 9], SamplingParams(max_tokens=40)))  # replayed id
    tokens: list[int] = []
    finishes: dict[str, list[tuple[FinishReason | None, object]]] = {}
    while core.has_work:
        for output in core.step().outputs:
            if output.finish_reason is not None:
                finishes.setdefault(output.request_id, []).append((output.finish_reason, output.stop_reason))
            if output.request_id == "ok":
                tokens += output.new_token_ids
    assert len(tokens) == 4 and finishes["ok"] == [(FinishReason.LENGTH, None)]
    for request_id in ("bad-prompt", "bad-bias"):
        [(reason, why)] = finishes[request_id]
        assert reason is FinishReason.ERROR and "outside the vocabulary" in str(why)


RESUMED_PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
    "seeded": SamplingParams(temperature=0.9, top_k=40, seed=11, max_tokens=24, ignore_eos=True),
    "penalized": SamplingParams(temperature=0.8, seed=3, presence_penalty=1.5, frequency_penalty=0.5,
                                repetition_penalty=1.3, min_tokens=20, max_tokens=24),
}


@pytest.mark.parametrize("kind", RESUMED_PARAMS)
def test_a_resumed_request_continues_as_it_would_have(tiny_model_dir: Path, kind: str) -> None:
    """Another engine given a request with its output so far (a lost engine's) gives the rest of
    what the request gives undisturbed: K/V recomputed, penalties, min/max_tokens and the seeded
    draws continue from the output position; batch mates change nothing."""
    config = EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05)
    params, prompt = RESUMED_PARAMS[kind], list(range(300, 317))

    def run(core: EngineCore, resumed: list[int]) -> list[int]:
        core.add_request(EngineCoreRequest("r", prompt, params, resumed_token_ids=resumed))
        tokens: list[int] = []
        while core.has_work:
            tokens += [t for output in core.step().outputs if output.request_id == "r" for t in output.new_token_ids]
        return tokens

    undisturbed = run(EngineCore(config), [])
    assert len(undisturbed) == 24
    for num_done in (1, 9, 23):
        core = EngineCore(config)
        for i, mate in enumerate(PROMPTS[:3]):
            core.add_request(EngineCoreRequest(f"mate{i}", mate, SamplingParams(temperature=1.0, max_tokens=30)))
        assert run(core, undisturbed[:num_done]) == undisturbed[num_done:]


@pytest.mark.slow  # NOTE: a process of its own
def test_an_engine_starts_and_steps_without_importing_torchs_compiler_or_sympy(tiny_model_dir: Path) -> None:
    # NOTE: torch._dynamo's import is 1.5 s of CPU and sympy's 0.3 s, which every engine start and
    # restart paid (a random initialisation of an embedding about to be overwritten; `to_empty`).
    script = (
        "import sys\n"
        "from engine_proc.core import EngineCore\n"
        "from proto.engine_config import EngineConfig\n"
        "from proto.engine_input import EngineCoreRequest, SamplingParams\n"
        f"core = EngineCore(EngineConfig(model_path={str(tiny_model_dir)!r}, kv_cache_memory_gib=0.05))\n"
        "core.add_request(EngineCoreRequest('0', [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True)))\n"
        "while core.has_work:\n"
        "    core.step()\n"
        "print(sorted(name for name in sys.modules if name.startswith(('torch._dynamo', 'torch._inductor', 'sympy'))))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]", result.stdout[:300]
