"""Speculative decoding in the scheduler: drafts verified by a fake greedy model, outputs unchanged."""

from __future__ import annotations

import dataclasses
import random

from engine_proc.kv_cache_manager import KVCacheManager
from engine_proc.ngram_proposer import NgramProposer
from engine_proc.request import Request
from engine_proc.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from proto.engine_input import EngineCoreRequest, SamplingParams
from proto.engine_output import FinishReason
from tests.engine_proc.scheduler_fakes import EOS, FakeModel, run_with_model


def looping_next_token(context: list[int], prefix_hash: int) -> int:
    """A model that loops: its next token depends on the last two only, so text soon repeats."""
    return hash((context[-2], context[-1])) % 6 + 1


def make_scheduler(with_drafts: bool, num_speculative_tokens: int = 3, max_num_batched_tokens: int = 64,
                   num_blocks: int = 256, max_num_drafting_seqs: int | None = None) -> Scheduler:
    config = SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=max_num_batched_tokens, max_model_len=256)
    proposer = NgramProposer(num_speculative_tokens, 1, 3) if with_drafts else None
    return Scheduler(config, KVCacheManager(num_blocks, 4), proposer, max_num_drafting_seqs)


def add(scheduler: Scheduler, request_id: str, prompt: list[int], **params: object) -> Request:
    sampling = SamplingParams(**{"temperature": 0.0, "max_tokens": 40, **params})  # type: ignore[arg-type]
    request = Request(EngineCoreRequest(request_id, prompt, sampling), (EOS,))
    scheduler.add_request(request)
    return request


def test_drafts_change_no_output_and_save_steps() -> None:
    rng = random.Random(0)
    prompts = {f"r{i}": [rng.randint(1, 40) for _ in range(rng.randint(3, 30))] for i in range(12)}
    max_tokens = {request_id: rng.randint(5, 60) for request_id in prompts}
    results, num_steps = {}, {}
    for with_drafts in (False, True):
        scheduler = make_scheduler(with_drafts)
        for request_id, prompt in prompts.items():
            add(scheduler, request_id, prompt, max_tokens=max_tokens[request_id])
        model = CountingModel(4, looping_next_token)
        results[with_drafts] = run_with_model(scheduler, model)
        num_steps[with_drafts] = model.num_steps
        if with_drafts:
            assert 0 < scheduler.num_accepted_tokens <= scheduler.num_draft_tokens
    # The fake model checks every K/V slot a step reads, so rolled-back drafts left nothing stale.
    assert results[True] == results[False]
    assert num_steps[True] < 0.7 * num_steps[False]


class CountingModel(FakeModel):
    num_steps = 0

    def __call__(self, step: SchedulerOutput) -> list[list[int]]:
        self.num_steps += 1
        return super().__call__(step)


def test_a_stop_token_among_accepted_tokens_ends_the_request_there() -> None:
    pattern = {(3, 4): 5, (4, 5): 6, (5, 6): EOS}
    scheduler = make_scheduler(True)
    request = add(scheduler, "r", [3, 4, 5, 6, 9, 3, 4])
    model = FakeModel(4, lambda context, _: pattern.get((context[-2], context[-1]), 9))
    step = scheduler.schedule()  # the prompt
    scheduler.update_from_output(step, model(step))
    assert request.output_token_ids == [5]
    step = scheduler.schedule()
    assert step.scheduled[0].spec_token_ids == (6, 9, 3)  # what followed "4 5" in the prompt
    (output,) = scheduler.update_from_output(step, model(step))
    # 6 accepted, 9 rejected: the model's own EOS comes next and ends the request.
    assert output.new_token_ids == [6, EOS]
    assert output.finish_reason is FinishReason.STOP
    assert request.output_token_ids == [5, 6, EOS]


def test_drafts_never_run_past_max_tokens() -> None:
    scheduler = make_scheduler(True, num_speculative_tokens=5)
    add(scheduler, "r", [7, 8] * 10, max_tokens=4)
    outputs = run_with_model(scheduler, FakeModel(4, lambda context, _: context[-2]))  # continues "7 8 7 8"
    assert outputs == {"r": [7, 8, 7, 8]}


def test_only_plain_greedy_requests_draft() -> None:
    scheduler = make_scheduler(True)
    prompt = [1, 2, 3] * 5
    add(scheduler, "greedy", prompt)
    add(scheduler, "sampled", prompt, temperature=0.8)
    add(scheduler, "logprobs", prompt, num_logprobs=2)
    add(scheduler, "penalized", prompt, presence_penalty=0.5)
    add(scheduler, "min-tokens", prompt, min_tokens=5)
    model = FakeModel(4, lambda context, _: context[-3])
    step = scheduler.schedule()
    scheduler.update_from_output(step, model(step))
    drafts = {s.request.request_id: s.spec_token_ids for s in scheduler.schedule().scheduled}
    assert drafts["greedy"] == (2, 3, 1)
    assert all(not drafts[name] for name in ("sampled", "logprobs", "penalized", "min-tokens"))


def three_drafting_requests(max_num_batched_tokens: int) -> tuple[Scheduler, FakeModel]:
    """Three requests past their prompts, each able to draft 5 tokens ("1 2 3" repeats); then the given budget."""
    model = FakeModel(4, lambda context, _: context[-3])
    scheduler = make_scheduler(True, num_speculative_tokens=5)
    for i in range(3):
        add(scheduler, f"r{i}", [1, 2, 3] * 5)
    step = scheduler.schedule()  # the three prompts
    scheduler.update_from_output(step, model(step))
    scheduler.config = dataclasses.replace(scheduler.config, max_num_batched_tokens=max_num_batched_tokens)
    return scheduler, model


def test_drafts_fit_the_token_budget_and_stop_above_the_drafting_batch_size() -> None:
    scheduler, model = three_drafting_requests(max_num_batched_tokens=8)
    step = scheduler.schedule()
    # r0 drafts all 5 (6 tokens), r1 the one token left of the budget, r2 waits for the next step.
    assert [(s.request.request_id, s.num_new_tokens) for s in step.scheduled] == [("r0", 6), ("r1", 2)]
    small = make_scheduler(True, max_num_drafting_seqs=2)
    for i in range(3):
        add(small, f"r{i}", [1, 2, 3] * 5)
    step = small.schedule()
    small.update_from_output(step, model(step))
    assert [s.spec_token_ids for s in small.schedule().scheduled] == [(), (), ()]


def test_in_a_batch_a_request_whose_drafts_miss_rests_then_tries_again() -> None:
    # The prompt has 100..159 each followed by 1; the model counts 100, 101, ...: every output
    # token occurred before, so there are always drafts ("1 ..."), and they always miss.
    prompt = [token for t in range(100, 160) for token in (t, 1)]
    model = FakeModel(4, lambda context, _: 100 + len(context) - len(prompt))

    def draft_steps(num_requests: int, num_steps: int) -> list[bool]:
        scheduler = make_scheduler(True, max_num_batched_tokens=256)  # each prompt in one step
        for i in range(num_requests):
            add(scheduler, f"r{i}", prompt, max_tokens=100)
        drafted = []
        for _ in range(num_steps):
            step = scheduler.schedule()
            drafted.append(bool(step.scheduled[0].spec_token_ids))
            scheduler.update_from_output(step, model(step))
        assert scheduler.num_accepted_tokens == 0
        return drafted[1:]  # after the prompt step

    assert all(draft_steps(1, 30))  # alone, drafts cost nothing: it keeps drafting
    batched = draft_steps(2, 30)
    first_rest = batched.index(False)
    assert 1 <= first_rest <= 3  # hopeful at first; a few misses and it rests...
    assert any(batched[first_rest:])  # ...then tries again
    assert sum(batched) < len(batched) / 3


def test_a_request_gets_fewer_drafts_after_misses_and_more_after_hits() -> None:
    def draft_lengths(scheduler: Scheduler, model: FakeModel, num_steps: int) -> list[int]:
        lengths = []
        for _ in range(num_steps):
            step = scheduler.schedule()
            lengths.append(len(step.scheduled[0].spec_token_ids))
            scheduler.update_from_output(step, model(step))
        return lengths

    # Drafts always there, always wrong (as in the test above): after the first miss, one.
    prompt = [token for t in range(100, 160) for token in (t, 1)]
    missing = make_scheduler(True, num_speculative_tokens=5, max_num_batched_tokens=256)
    add(missing, "r", prompt, max_tokens=100)
    counting = FakeModel(4, lambda context, _: 100 + len(context) - len(prompt))
    assert draft_lengths(missing, counting, 5) == [0, 5, 1, 1, 1]  # 0: the prompt's step
    # Drafts always right ("1 2 3" repeats): two more after each step that accepted them all.
    hitting = make_scheduler(True, num_speculative_tokens=5, max_num_batched_tokens=256)
    request = add(hitting, "r", [1, 2, 3] * 5, max_tokens=100)
    repeating = FakeModel(4, lambda context, _: context[-3])
    assert draft_lengths(hitting, repeating, 3) == [0, 5, 5]
    request.num_draft_slots = 1
    assert draft_lengths(hitting, repeating, 4) == [1, 3, 5, 5]
    # A miss after some hits: as many as were accepted, and one more.
    pattern = [1, 2, 3, 4, 5, 6, 7, 8]
    partly = make_scheduler(True, num_speculative_tokens=5, max_num_batched_tokens=256)
    request = add(partly, "r", pattern * 3, max_tokens=100)
    # It follows the pattern, except that 4 comes after 2: of the drafts "2 3 4 5 6", "3" misses.
    model = FakeModel(4, lambda context, _: 4 if context[-1] == 2 else pattern[context[-1] % 8])
    step = partly.schedule()  # the prompt: 1 follows 8
    partly.update_from_output(step, model(step))
    step = partly.schedule()
    assert step.scheduled[0].spec_token_ids == (2, 3, 4, 5, 6)
    (output,) = partly.update_from_output(step, model(step))
    assert output.new_token_ids == [2, 4]  # "2" accepted, then the model's own 4
    assert request.num_draft_slots == 2  # one accepted ("2"), one more


def test_while_a_prompt_waits_drafts_take_at_most_half_the_step() -> None:
    scheduler, model = three_drafting_requests(max_num_batched_tokens=16)
    add(scheduler, "late", [4, 5, 6] * 4)
    step = scheduler.schedule()
    num_drafts = sum(len(s.spec_token_ids) for s in step.scheduled)
    assert num_drafts == 8  # 5 + 3 of a half budget; alone they would have taken all 16 tokens
    assert [(s.request.request_id, s.num_new_tokens) for s in step.scheduled][-1] == ("late", 16 - 3 - num_drafts)
    scheduler.update_from_output(step, model(step))
    # Once no prompt waits, drafts may fill the step again.
    while scheduler.requests["late"].num_computed_tokens < 12:
        step = scheduler.schedule()
        scheduler.update_from_output(step, model(step))
    assert sum(len(s.spec_token_ids) for s in scheduler.schedule().scheduled) > 8
