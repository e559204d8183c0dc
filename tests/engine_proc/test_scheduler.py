"""The scheduler and KV cache manager, driven with fake model outputs (no model)."""

from __future__ import annotations

from engine_proc.kv_cache_manager import KVCacheManager
from engine_proc.request import Request
from engine_proc.scheduler import Scheduler, SchedulerConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from proto.engine_output import FinishReason

EOS = 0


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8,
                   max_num_batched_tokens: int = 32, max_model_len: int = 128) -> Scheduler:
    config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len)
    return Scheduler(config, KVCacheManager(num_blocks, block_size))


def make_request(request_id: str, num_prompt: int, max_tokens: int = 4) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=False)
    return Request(EngineCoreRequest(request_id, list(range(1, num_prompt + 1)), params), (EOS,))


def run_to_completion(scheduler: Scheduler, token: int = 7, max_steps: int = 1000) -> dict[str, list[int]]:
    """Steps with a fake model that always samples `token`; returns each request's outputs."""
    outputs: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests:
            return outputs
        step = scheduler.schedule()
        assert step.num_scheduled_tokens <= scheduler.config.max_num_batched_tokens
        num_sampling = sum(s.is_sampling for s in step.scheduled)
        for output in scheduler.update_from_output(step, [token] * num_sampling):
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
    raise AssertionError("requests did not finish")


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
        scheduler.update_from_output(step, [7] * sum(s.is_sampling for s in step.scheduled))
    assert chunks == [8, 8, 4]
    assert run_to_completion(scheduler) == {"long": [7]}  # the first token came with the last chunk


def test_finished_and_aborted_requests_free_all_blocks() -> None:
    scheduler = make_scheduler()
    for i in range(5):
        scheduler.add_request(make_request(f"r{i}", 6, max_tokens=3))
    scheduler.update_from_output(scheduler.schedule(), [7] * 5)
    scheduler.abort_requests(["r1", "unknown"])
    outputs = run_to_completion(scheduler)
    assert set(outputs) == {"r0", "r2", "r3", "r4"}
    assert all(len(tokens) == 2 for tokens in outputs.values())
    assert scheduler.kv_cache_manager.num_free_blocks == 64


def test_eos_and_stop_token_ids_finish_a_request() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("eos", 3, max_tokens=10))
    step = scheduler.schedule()
    (output,) = scheduler.update_from_output(step, [EOS])
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
