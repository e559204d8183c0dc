"""Continuous-batching scheduler: who runs this step, and how many tokens each.

There is no prefill or decode phase. Every request has `num_tokens` (prompt plus
outputs so far) and `num_computed_tokens` (those with K/V in the cache); each step moves
`num_computed_tokens` toward `num_tokens` within a token budget. A request whose step
reaches its last known token samples one new token. A prompt longer than the budget is
split across steps (chunked prefill) while decodes keep flowing.

Order: running requests first, then waiting ones. Under the `fcfs` policy both go oldest
first; under `priority` they go by (priority, arrival), lower values first. When blocks
run out for a running request, the last running request in that order is preempted: its
blocks are freed (they stay in the prefix cache) and it goes back to the waiting queue to
be recomputed later. A newly admitted request starts from its cached prefix, if any.

With a drafter (speculative decoding), a running greedy request at its last token also
gets draft tokens: it is scheduled for 1 + drafts tokens, the runner returns the tokens the
model agreed with plus its own next one, and `num_computed_tokens` steps back over the
rejected drafts (their K/V slots are simply written again next step).

Each request records QUEUED when added, SCHEDULED when admitted (again after a preemption)
and PREEMPTED, stamped with `time.time()`; they ride on its next output.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import NamedTuple

from engine_proc.kv_cache_manager import KVCacheManager
from engine_proc.ngram_proposer import NgramProposer
from engine_proc.request import Request, RequestStatus
from engine_proc.request_queue import make_request_queue
from proto.engine_config import EngineConfig
from proto.engine_output import EngineCoreEventType, EngineCoreOutput, FinishReason
from proto.settings import check_value

# NOTE: a draft token costs little while a request runs alone (its forward of up to 4 tokens
# costs what one token's does), but in a batch every draft is compute and pays only when about
# a third of them are accepted. So in a batch a request drafts while the running mean of its
# accepted share stays above this, and otherwise rests, its mean creeping back up each step.
_MIN_DRAFT_ACCEPTANCE = 0.35
_DRAFT_ACCEPTANCE_RECOVERY = 0.05
# NOTE: how many drafts a request gets follows its luck: two more after a step that accepted
# every draft (as transformers' "heuristic" schedule for assistant tokens), and after a miss
# one more than it had accepted. Text that repeats itself earns long runs of drafts; text
# that does not stops paying for drafts past the first that misses.
_DRAFT_SLOTS_GROWTH = 2


class ScheduledRequest(NamedTuple):
    """One request's share of a step."""

    request: Request
    num_new_tokens: int  # its draft tokens included
    spec_token_ids: tuple[int, ...] = ()  # drafts to verify, after the request's last known token

    @property
    def is_sampling(self) -> bool:
        """True when this step computes the request's last known token, so it samples."""
        request = self.request
        return request.num_computed_tokens + self.num_new_tokens == request.num_tokens + len(self.spec_token_ids)


@dataclass
class SchedulerOutput:
    """The batch of one step."""

    scheduled: list[ScheduledRequest] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


# NOTE: the scheduler's settings are the engine's: declared, defaulted and checked there alone.
_ENGINE_SETTINGS = {config_field.name: config_field for config_field in dataclasses.fields(EngineConfig)}


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits of one step (the engine's settings) and of the model's context (its length as loaded)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    scheduling_policy: str = EngineConfig.scheduling_policy

    def __post_init__(self) -> None:
        for config_field in dataclasses.fields(self):
            check_value(_ENGINE_SETTINGS[config_field.name], getattr(self, config_field.name))

    @staticmethod
    def of(config: EngineConfig, max_model_len: int) -> SchedulerConfig:
        """The engine's step limits, with the context length learned at load (`config`'s, else the model's)."""
        return SchedulerConfig(
            config.max_num_seqs, config.max_num_batched_tokens, max_model_len, config.scheduling_policy
        )


class Scheduler:
    """Decides each step's batch and turns sampled tokens into outputs."""

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: KVCacheManager,
        proposer: NgramProposer | None = None,
        max_num_drafting_seqs: int | None = None,
    ) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        self.proposer = proposer
        self.max_num_drafts = 0 if proposer is None else proposer.num_speculative_tokens
        # NOTE: above this many running requests nobody drafts (the batch is compute-bound already).
        self.max_num_drafting_seqs = max_num_drafting_seqs
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0
        self.requests: dict[str, Request] = {}
        self.waiting = make_request_queue(config.scheduling_policy)
        self.running: list[Request] = []
        self.num_preemptions = 0

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def has_unfinished_requests(self) -> bool:
        return self.num_unfinished_requests > 0

    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        request.num_draft_slots = self.max_num_drafts
        self.waiting.add(request)
        request.record_event(EngineCoreEventType.QUEUED)

    def abort_requests(self, request_ids: list[str]) -> list[Request]:
        """Removes requests at once and frees their blocks; unknown ids are ignored."""
        aborted = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            request.finish_reason = FinishReason.ABORT
            self._finish(request)
            aborted.append(request)
        return aborted

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        budget = self.config.max_num_batched_tokens
        # 1) Running requests in policy order; preempt the last when blocks run out.
        if self.config.scheduling_policy == "priority":
            self.running.sort(key=lambda request: request.sort_key)
            self._make_room_for_waiting()
        index = 0
        is_drafting = self.proposer is not None and (
            self.max_num_drafting_seqs is None or len(self.running) <= self.max_num_drafting_seqs
        )
        # NOTE: drafts are a bet; while prompts wait for their forward, drafts take at most
        # half the step's tokens, so a batch of long draft runs cannot hold prompts back.
        draft_budget = budget
        if is_drafting and (self.waiting or any(r.num_tokens - r.num_computed_tokens > 1 for r in self.running)):
            draft_budget //= 2
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            spec_token_ids = (
                self._drafts(request, min(budget - 1, draft_budget)) if is_drafting and num_new == 1 else ()
            )
            draft_budget -= len(spec_token_ids)
            num_new += len(spec_token_ids)
            while not self.kv_cache_manager.can_allocate(request, num_new):
                victim = self.running[-1]
                self._preempt(victim)
                if victim is request:
                    break
            if request.status is not RequestStatus.RUNNING:
                break
            self.kv_cache_manager.allocate(request, num_new)
            output.scheduled.append(ScheduledRequest(request, num_new, spec_token_ids))
            budget -= num_new
            index += 1
        # 2) Waiting requests, in order, while the budget, the cap and the blocks allow.
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self._next_waiting()
            if request is None:
                break
            cached = self.kv_cache_manager.get_computed_blocks(request)
            num_new = min(request.num_tokens - cached.num_tokens, budget)
            if not self.kv_cache_manager.can_allocate(request, num_new, cached):
                break
            self._take_waiting(request)
            self.kv_cache_manager.allocate(request, num_new, cached)
            request.status = RequestStatus.RUNNING
            request.record_event(EngineCoreEventType.SCHEDULED)
            self.running.append(request)
            output.scheduled.append(ScheduledRequest(request, num_new))
            budget -= num_new
        return output

    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled_token_ids: list[list[int]]
    ) -> list[EngineCoreOutput]:
        """Advances each scheduled request; `sampled_token_ids` has the new ids of each sampling request.

        A request that verified drafts has its accepted drafts and then the model's own
        next token there; the rejected drafts' positions count as not computed.
        """
        outputs = []
        sampled = iter(sampled_token_ids)
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            is_sampling = scheduled.is_sampling
            if not is_sampling:
                request.num_computed_tokens += scheduled.num_new_tokens
                continue
            token_ids = next(sampled)
            num_drafts = len(scheduled.spec_token_ids)
            num_rejected = num_drafts + 1 - len(token_ids)
            request.num_computed_tokens += scheduled.num_new_tokens - num_rejected
            self.num_draft_tokens += num_drafts
            self.num_accepted_tokens += num_drafts - num_rejected
            if num_drafts:
                share = (num_drafts - num_rejected) / num_drafts
                request.draft_acceptance = (request.draft_acceptance + share) / 2
                request.num_draft_slots = (
                    min(request.num_draft_slots + _DRAFT_SLOTS_GROWTH, self.max_num_drafts)
                    if num_rejected == 0 else num_drafts - num_rejected + 1
                )
            if request.is_finished:
                continue  # NOTE: aborted while its step ran; its tokens are dropped.
            new_token_ids = []
            for token_id in token_ids:
                request.append_output_token(token_id)
                new_token_ids.append(token_id)
                if request.check_stop(self.config.max_model_len):
                    self._finish(request)
                    break
            outputs.append(
                EngineCoreOutput(
                    request.request_id, new_token_ids, request.finish_reason, request.stop_reason,
                    events=request.take_events(), num_cached_tokens=request.num_cached_tokens,
                )
            )
        return outputs

    def _next_waiting(self) -> Request | None:
        """The first waiting request in policy order that is not waiting for its grammar."""
        request = self.waiting.peek()
        if not request.is_waiting_for_grammar:
            return request
        return next((r for r in self.waiting if not r.is_waiting_for_grammar), None)

    def _take_waiting(self, request: Request) -> None:
        if request is self.waiting.peek():
            self.waiting.pop()
        else:
            self.waiting.remove(request)

    def _drafts(self, request: Request, max_num_tokens: int) -> tuple[int, ...]:
        """Draft tokens for a request at its last token, if it samples greedily and plainly.

        NOTE: greedy verification keeps outputs exactly those of plain decoding; requests
        that sample, penalize, bias, ban (min_tokens) or report logprobs decode one token a
        step, and so, in a batch, does a request whose drafts have mostly missed lately.
        """
        params = request.sampling_params
        assert self.proposer is not None
        if not (
            params.is_greedy and params.num_logprobs is None and params.num_prompt_logprobs is None
            and not params.has_penalties and not params.logit_bias
            and (request.grammar is None or request.grammar.is_drafting_allowed)
            and request.num_output_tokens >= params.min_tokens
        ):
            return ()
        # Room for all drafts and the token after them within max_tokens and the context.
        max_num_tokens = min(
            max_num_tokens,
            request.num_draft_slots,
            params.max_tokens - request.num_output_tokens - 1,
            self.config.max_model_len - request.num_tokens - 1,
        )
        if max_num_tokens <= 0:
            return ()
        if len(self.running) > 1 and request.draft_acceptance < _MIN_DRAFT_ACCEPTANCE:
            request.draft_acceptance += _DRAFT_ACCEPTANCE_RECOVERY
            return ()
        drafts = tuple(self.proposer.propose(request.token_array, max_num_tokens))
        if drafts and request.grammar is not None:
            # NOTE: a draft its grammar refuses would be rejected; so would every draft after it.
            drafts = drafts[: request.grammar.num_valid_drafts(drafts)]
        return drafts

    def _make_room_for_waiting(self) -> None:
        """Preempts the lowest-priority running requests while a waiting one outranks them and cannot fit."""
        manager = self.kv_cache_manager
        while self.waiting and self.running:
            candidate, victim = self.waiting.peek(), self.running[-1]
            if victim.sort_key <= candidate.sort_key:
                return
            cached = manager.get_computed_blocks(candidate)
            num_new = min(candidate.num_tokens - cached.num_tokens, self.config.max_num_batched_tokens)
            if len(self.running) < self.config.max_num_seqs and manager.can_allocate(candidate, num_new, cached):
                return
            self._preempt(victim)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv_cache_manager.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        request.record_event(EngineCoreEventType.PREEMPTED)
        self.num_preemptions += 1
        self.waiting.prepend(request)

    def _finish(self, request: Request) -> None:
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
