"""RequestOutputCollector: one mailbox for a request's samples, unread deltas merged."""

from __future__ import annotations

import asyncio

import pytest

from service.frontend.output_processor import RequestOutputCollector
from service.frontend.outputs import CompletionOutput, RequestOutput


def delta(request_id: str, text: str, token_id: int, finished: bool = False) -> RequestOutput:
    return RequestOutput(request_id, None, [1], [CompletionOutput(0, text, [token_id])], finished=finished)


async def test_unread_deltas_merge_per_sample_and_come_out_in_arrival_order() -> None:
    collector = RequestOutputCollector()
    collector.put(1, delta("r-1", "a", 10))
    collector.put(0, delta("r-0", "x", 20))
    collector.put(1, delta("r-1", "b", 11, finished=True))
    outputs = await collector.get()
    assert [(index, o.outputs[0].text, o.outputs[0].token_ids, o.finished) for index, o in outputs] == [
        (1, "ab", [10, 11], True), (0, "x", [20], False)
    ]
    assert collector.get_nowait() == []


async def test_a_waiting_reader_wakes_for_a_delta_or_an_error() -> None:
    collector = RequestOutputCollector()
    reader = asyncio.create_task(collector.get())
    await asyncio.sleep(0)
    assert not reader.done()
    collector.put(0, delta("r", "hi", 5))
    assert [o.outputs[0].text for _, o in await reader] == ["hi"]
    reader = asyncio.create_task(collector.get())
    await asyncio.sleep(0)
    collector.put_error(RuntimeError("engine gone"))
    with pytest.raises(RuntimeError, match="engine gone"):
        await reader
