"""The scheduler and KV cache manager, driven with fake model outputs (no model)."""

from __future__ import annotations

import random

import pytest

from engine_proc.scheduler import Scheduler, SchedulerConfig
from proto.engine_config import EngineConfig
from proto.engine_output import FinishReason
from tests.engine_proc.scheduler_fakes import (
    EOS,
    FakeModel,
    make_request,
    make_scheduler,
    run_to_completion,
    run_with_model,
)


def test_admission_respects_token_budget_and_sequence_cap() -> None:
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=10)
    for i in range(3):
        scheduler.add_request(make_request(f"r{i}", 4))
    step = scheduler.schedule()
    assert [s.request.request_id for s in step.scheduled] == ["r0", "r1"]
    assert len(scheduler.waiting) == 1


def test_long_prompt_is_chunked_across_steps() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    scheduler.add_request(make_request("long", 20, max_tokens=2))
    chunks = []
    for _ in range(3):
        step = scheduler.schedule()
        chunks.append(step.scheduled[0].num_new_tokens)
        assert not step.scheduled[0].is_sampling or sum(chunks) == 20
        scheduler.update_from_output(step, [[7]] * sum(s.is_sampling for s in step.scheduled))
    assert chunks == [8, 8, 4]
    assert run_to_completion(scheduler) == {"long": [7]}  # the first token came with the last chunk


def test_finished_and_aborted_requests_free_all_blocks() -> None:
    scheduler = make_scheduler()
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}", 6, max_tokens=3))
    scheduler.update_from_output(scheduler.schedule(), [[7]] * 5)
    scheduler.abort_requests(["r1", "unknown"])
    outputs = run_to_completion(scheduler)
    assert set(outputs) == {"r0", "r2", "r3", "r4"}
    assert all(len(tokens) == 2 for tokens in outputs.values())
    assert scheduler.kv_cache_manager.num_free_blocks == 64


def test_eos_and_stop_token_ids_finish_a_request() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("eos", 3, max_tokens=10))
    step = scheduler.schedule()
    (output,) = scheduler.update_from_output(step, [[EOS]])
    assert output.finish_reason is FinishReason.STOP
    assert scheduler.kv_cache_manager.num_free_blocks == 64


def test_preemption_when_blocks_run_out_and_everyone_still_finishes() -> None:
    # 6 blocks of 4 tokens: two requests of 8 prompt + 8 output tokens cannot both fit.
    scheduler = make_scheduler(num_blocks=6, block_size=4, max_num_batched_tokens=64)
    scheduler.add_request(make_request("a", 8, max_tokens=8))
    scheduler.add_request(make_request("b", 8, max_tokens=8))
    outputs = run_to_completion(scheduler)
    assert outputs == {"a": [7] * 8, "b": [7] * 8}
    assert scheduler.num_preemptions >= 1
    assert scheduler.kv_cache_manager.num_free_blocks == 6


def assert_no_block_leaked(scheduler: Scheduler) -> None:
    manager = scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_blocks
    assert all(block.ref_cnt == 0 for block in manager.block_pool.blocks)


def test_second_request_with_a_cached_2000_token_prefix_computes_only_its_suffix() -> None:
    scheduler = make_scheduler(num_blocks=512, block_size=16, max_num_batched_tokens=4096, max_model_len=4096)
    model = FakeModel(block_size=16)
    rng = random.Random(0)
    prefix = [rng.randrange(1, 30_000) for _ in range(2000)]
    scheduler.add_request(make_request("first", prefix + [11, 12, 13], max_tokens=3))
    first_step = scheduler.schedule()
    assert first_step.num_scheduled_tokens == 2003
    scheduler.update_from_output(first_step, model(first_step))
    run_with_model(scheduler, model)
    scheduler.add_request(make_request("second", prefix + [21, 22, 23, 24, 25], max_tokens=3))
    second_step = scheduler.schedule()
    assert second_step.num_scheduled_tokens == 5  # 2000 = 125 full blocks of 16, all cached
    assert second_step.scheduled[0].request.num_computed_tokens == 2000
    scheduler.update_from_output(second_step, model(second_step))  # reads the cached prefix
    run_with_model(scheduler, model)
    assert_no_block_leaked(scheduler)


def test_prefix_caching_does_not_change_outputs() -> None:
    rng = random.Random(1)
    shared = [rng.randrange(1, 1000) for _ in range(37)]
    prompts = {f"r{i}": shared[: rng.randrange(10, 37)] + [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 20))]
               for i in range(12)}
    results = []
    for is_caching in (False, True):
        scheduler = make_scheduler(num_blocks=200, max_num_batched_tokens=24, enable_prefix_caching=is_caching)
        for request_id, prompt in prompts.items():
            scheduler.add_request(make_request(request_id, prompt, max_tokens=6))
        results.append(run_with_model(scheduler))
        assert_no_block_leaked(scheduler)
    assert results[0] == results[1]


def test_preempted_requests_finish_later_with_the_outputs_they_get_alone() -> None:
    rng = random.Random(2)
    prompts = {f"r{i}": [rng.randrange(1, 1000) for _ in range(rng.randrange(3, 30))] for i in range(10)}
    alone = {}
    for request_id, prompt in prompts.items():
        scheduler = make_scheduler(num_blocks=64)
        scheduler.add_request(make_request(request_id, prompt, max_tokens=10))
        alone.update(run_with_model(scheduler))
    for is_caching in (False, True):
        # 16 blocks of 4 tokens cannot hold ten requests of up to 40 tokens each.
        scheduler = make_scheduler(num_blocks=16, max_num_batched_tokens=16, enable_prefix_caching=is_caching)
        for request_id, prompt in prompts.items():
            scheduler.add_request(make_request(request_id, prompt, max_tokens=10))
        assert run_with_model(scheduler) == alone
        assert scheduler.num_preemptions > 0
        assert_no_block_leaked(scheduler)


def test_priority_policy_serves_lower_values_first_and_ties_by_arrival() -> None:
    scheduler = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    for request_id, priority in [("late-low", 5), ("urgent", -1), ("normal-1", 0), ("normal-2", 0)]:
        scheduler.add_request(make_request(request_id, 4, max_tokens=2, priority=priority))
    finished = []
    while scheduler.has_unfinished_requests:
        step = scheduler.schedule()
        outputs = scheduler.update_from_output(step, [[7]] * sum(s.is_sampling for s in step.scheduled))
        finished += [output.request_id for output in outputs if output.is_finished]
    assert finished == ["urgent", "normal-1", "normal-2", "late-low"]
    assert_no_block_leaked(scheduler)


def test_priority_policy_preempts_the_lowest_priority_request() -> None:
    scheduler = make_scheduler(num_blocks=6, max_num_batched_tokens=64, scheduling_policy="priority")
    scheduler.add_request(make_request("background", 8, max_tokens=8, priority=10))
    scheduler.update_from_output(scheduler.schedule(), [[7]])
    scheduler.add_request(make_request("interactive", 8, max_tokens=8, priority=0))
    preempted = []
    while scheduler.has_unfinished_requests:
        step = scheduler.schedule()
        preempted += [r.request_id for r in scheduler.waiting]
        scheduler.update_from_output(step, [[7]] * sum(s.is_sampling for s in step.scheduled))
    assert "background" in preempted and "interactive" not in preempted
    assert_no_block_leaked(scheduler)


def test_aborts_free_blocks_at_once() -> None:
    scheduler = make_scheduler(num_blocks=10, max_num_seqs=2)
    model = FakeModel(block_size=4)
    for i in range(4):
        scheduler.add_request(make_request(f"r{i}", 9, max_tokens=20))
    step = scheduler.schedule()
    scheduler.update_from_output(step, model(step))
    assert scheduler.kv_cache_manager.num_free_blocks < 10
    aborted = scheduler.abort_requests(["r0", "r1", "r3"])  # two running, one waiting
    assert [r.finish_reason for r in aborted] == [FinishReason.ABORT] * 3
    assert scheduler.kv_cache_manager.num_free_blocks == 10
    assert run_with_model(scheduler, model).keys() == {"r2"}
    assert_no_block_leaked(scheduler)


def test_priority_policy_preempts_a_running_request_for_a_more_urgent_one() -> None:
    scheduler = make_scheduler(max_num_seqs=1, scheduling_policy="priority")
    model = FakeModel(block_size=4)
    scheduler.add_request(make_request("background", 6, max_tokens=10, priority=5))
    step = scheduler.schedule()
    scheduler.update_from_output(step, model(step))
    scheduler.add_request(make_request("urgent", 6, max_tokens=2, priority=0))
    step = scheduler.schedule()
    assert [s.request.request_id for s in step.scheduled] == ["urgent"]
    assert [r.request_id for r in scheduler.waiting] == ["background"]
    scheduler.update_from_output(step, model(step))
    outputs = run_with_model(scheduler, model)
    assert len(outputs["urgent"]) == 1 and len(outputs["background"]) == 9
    assert_no_block_leaked(scheduler)


class _PendingGrammar:
    """A grammar that compiles when the test says so; it records the tokens it is given."""

    def __init__(self) -> None:
        self.is_ready = False
        self.is_terminated = False
        self.accepted: list[int] = []

    def accept(self, token_id: int) -> None:
        self.accepted.append(token_id)


def test_a_request_waits_for_its_grammar_while_the_others_run() -> None:
    scheduler = make_scheduler()
    constrained, free = make_request("constrained", 4), make_request("free", 4)
    grammar = _PendingGrammar()
    constrained.grammar = grammar
    scheduler.add_request(constrained)
    scheduler.add_request(free)
    assert [s.request.request_id for s in scheduler.schedule().scheduled] == ["free"]
    assert [s.request.request_id for s in scheduler.schedule().scheduled] == ["free"]
    grammar.is_ready = True
    assert "constrained" in [s.request.request_id for s in scheduler.schedule().scheduled]
    constrained.append_output_token(7)
    assert grammar.accepted == [7]


def test_the_scheduler_takes_the_engines_settings_and_their_checks() -> None:
    engine = EngineConfig(max_num_seqs=3, max_num_batched_tokens=48, scheduling_policy="priority")
    assert SchedulerConfig.of(engine, max_model_len=100) == SchedulerConfig(3, 48, 100, "priority")
    assert SchedulerConfig(1, 1, 1).scheduling_policy == EngineConfig().scheduling_policy
    with pytest.raises(ValueError, match="scheduling_policy must be one of fcfs, priority"):
        SchedulerConfig(1, 1, 1, "lifo")
    with pytest.raises(ValueError, match="max_num_seqs: must be >= 1"):
        SchedulerConfig(0, 1, 1)
