"""Fakes that drive the scheduler and KV cache manager without a model: requests, a scheduler,
and a model that checks every token's K/V slot and samples from the context."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from engine_proc.kv_cache_manager import KVCacheManager
from engine_proc.request import Request
from engine_proc.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from proto.engine_input import EngineCoreRequest, SamplingParams

EOS = 0


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 8,
                   max_num_batched_tokens: int = 32, max_model_len: int = 128,
                   scheduling_policy: str = "fcfs", enable_prefix_caching: bool = True) -> Scheduler:
    config = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len, scheduling_policy)
    return Scheduler(config, KVCacheManager(num_blocks, block_size, enable_prefix_caching))


def make_request(request_id: str, num_prompt: int | list[int], max_tokens: int = 4,
                 priority: int = 0) -> Request:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=False)
    prompt = list(range(1, num_prompt + 1)) if isinstance(num_prompt, int) else num_prompt
    return Request(EngineCoreRequest(request_id, prompt, params, priority=priority), (EOS,))


class FakeModel:
    """Stands in for the model: writes each token's K/V into its cache slot, checks that every
    token a step attends to is in place, and samples a token determined by the whole context.

    A slot holds a running hash of the tokens up to its position, which is what real K/V
    depend on; so a wrong block table, a stale cached block or a bad recompute shows up as a
    mismatch, and as different output tokens.
    """

    def __init__(self, block_size: int, next_token: Callable[[list[int], int], int] | None = None) -> None:
        self.block_size = block_size
        self.slots: dict[int, int] = {}
        # (context, its running hash) -> the greedy next token; by default a hash of the whole context.
        self.next_token = next_token or (lambda context, prefix_hash: prefix_hash % 50 + 1)  # never EOS

    def __call__(self, step: SchedulerOutput) -> list[list[int]]:
        spans = []
        for scheduled in step.scheduled:
            request, num_new, drafts = scheduled
            tokens = request.all_token_ids + list(drafts)
            prefix_hashes = list(itertools.accumulate(tokens, lambda h, t: hash((h, t)), initial=0))[1:]
            start = request.num_computed_tokens
            spans.append((scheduled, start + num_new, tokens, prefix_hashes))
            for position in range(start, start + num_new):
                self.slots[self._slot(request, position)] = prefix_hashes[position]
        sampled = []
        for scheduled, end, tokens, prefix_hashes in spans:
            request = scheduled.request
            for position in range(end):
                assert self.slots[self._slot(request, position)] == prefix_hashes[position], request.request_id
            if not scheduled.is_sampling:
                continue
            # Greedy verification: each draft stands while it is the token the model picks there.
            new_token_ids = []
            for position in range(request.num_tokens - 1, end):
                new_token_ids.append(self.next_token(tokens[: position + 1], prefix_hashes[position]))
                if position + 1 < end and tokens[position + 1] != new_token_ids[-1]:
                    break
            sampled.append(new_token_ids)
        return sampled

    def _slot(self, request: Request, position: int) -> int:
        return request.block_ids[position // self.block_size] * self.block_size + position % self.block_size


def run_with_model(scheduler: Scheduler, model: FakeModel | None = None,
                   max_steps: int = 10_000) -> dict[str, list[int]]:
    """Steps with a FakeModel until every request is done; returns each request's outputs."""
    model = model or FakeModel(scheduler.kv_cache_manager.block_size)
    outputs: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests:
            return outputs
        step = scheduler.schedule()
        assert step.num_scheduled_tokens <= scheduler.config.max_num_batched_tokens
        assert len(step.scheduled) <= scheduler.config.max_num_seqs
        for output in scheduler.update_from_output(step, model(step)):
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
    raise AssertionError("requests did not finish")


def run_to_completion(scheduler: Scheduler, token: int = 7, max_steps: int = 1000) -> dict[str, list[int]]:
    """Steps with a fake model that always samples `token`; returns each request's outputs."""
    outputs: dict[str, list[int]] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests:
            return outputs
        step = scheduler.schedule()
        assert step.num_scheduled_tokens <= scheduler.config.max_num_batched_tokens
        num_sampling = sum(s.is_sampling for s in step.scheduled)
        for output in scheduler.update_from_output(step, [[token]] * num_sampling):
            outputs.setdefault(output.request_id, []).extend(output.new_token_ids)
    raise AssertionError("requests did not finish")
