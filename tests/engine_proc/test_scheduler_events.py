"""Scheduling events (QUEUED, SCHEDULED, PREEMPTED) ride on each request's next output."""

from __future__ import annotations

import time

from engine_proc.scheduler import Scheduler
from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_output import EngineCoreEventType, EngineCoreOutput, EngineCoreOutputs
from tests.engine_proc.scheduler_fakes import FakeModel, make_request, make_scheduler

QUEUED, SCHEDULED, PREEMPTED = EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED, EngineCoreEventType.PREEMPTED


def step(scheduler: Scheduler, model: FakeModel) -> list[EngineCoreOutput]:
    scheduler_output = scheduler.schedule()
    return scheduler.update_from_output(scheduler_output, model(scheduler_output))


def run_outputs(scheduler: Scheduler, max_steps: int = 1000) -> list[EngineCoreOutput]:
    model = FakeModel(scheduler.kv_cache_manager.block_size)
    outputs: list[EngineCoreOutput] = []
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests:
            return outputs
        outputs += step(scheduler, model)
    raise AssertionError("requests did not finish")


def test_first_output_carries_queued_then_scheduled_and_later_ones_none() -> None:
    scheduler = make_scheduler()
    before = time.time()
    scheduler.add_request(make_request("a", 6, max_tokens=3))
    outputs = run_outputs(scheduler)
    after = time.time()
    assert len(outputs) == 3
    events = outputs[0].events
    assert events is not None
    assert [e.type for e in events] == [QUEUED, SCHEDULED]
    assert before <= events[0].timestamp <= events[1].timestamp <= after
    assert outputs[1].events is None and outputs[2].events is None


def test_chunked_prefill_keeps_events_until_the_first_token() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=4)
    scheduler.add_request(make_request("a", 10, max_tokens=2))
    model = FakeModel(scheduler.kv_cache_manager.block_size)
    assert step(scheduler, model) == []  # a prefill chunk, no token yet
    assert step(scheduler, model) == []
    (first,) = step(scheduler, model)
    assert first.events is not None
    assert [e.type for e in first.events] == [QUEUED, SCHEDULED]


def test_a_request_waiting_behind_the_cap_is_scheduled_later_than_queued() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    scheduler.add_request(make_request("a", 4, max_tokens=3))
    scheduler.add_request(make_request("b", 4, max_tokens=1))
    outputs = run_outputs(scheduler)
    (b_first,) = [o for o in outputs if o.request_id == "b"]
    assert b_first.events is not None
    queued, scheduled = b_first.events
    assert (queued.type, scheduled.type) == (QUEUED, SCHEDULED)
    assert scheduled.timestamp > queued.timestamp


def test_preemption_records_preempted_then_scheduled_again() -> None:
    # NOTE: 4 blocks of 4 tokens: two requests growing past 8 tokens each cannot both fit.
    scheduler = make_scheduler(num_blocks=4, block_size=4, max_num_batched_tokens=64, enable_prefix_caching=False)
    scheduler.add_request(make_request("a", 4, max_tokens=8))
    scheduler.add_request(make_request("b", 4, max_tokens=8))
    outputs = run_outputs(scheduler)
    assert scheduler.num_preemptions > 0
    types = [e.type for o in outputs if o.request_id == "b" for e in o.events or ()]
    assert types[:2] == [QUEUED, SCHEDULED]
    assert types.count(PREEMPTED) == scheduler.num_preemptions
    # every preemption is followed by a new SCHEDULED before the request's next token
    for index, event_type in enumerate(types):
        if event_type is PREEMPTED:
            assert types[index + 1] is SCHEDULED


def test_events_survive_the_wire() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", 4, max_tokens=1))
    outputs = EngineCoreOutputs(outputs=run_outputs(scheduler), timestamp=time.time())
    decoded = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(outputs))
    events = decoded.outputs[0].events
    assert events is not None
    assert [e.type for e in events] == [QUEUED, SCHEDULED]
    assert isinstance(events[0].type, EngineCoreEventType)
    assert events == outputs.outputs[0].events
