"""ParentRequest child ids and seeds; merging child streams and closing them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from service.frontend.outputs import CompletionOutput, RequestOutput
from service.frontend.parallel_sampling import ParentRequest, merge_streams
from service.frontend.sampling_params import SamplingParams


def test_children_get_distinct_reproducible_seeds_and_ids() -> None:
    parent = ParentRequest("req", SamplingParams(seed=10, n=3))
    assert [parent.child_sampling_params(i).seed for i in range(3)] == [10, 11, 12]
    assert len({parent.child_request_id(i) for i in range(3)}) == 3
    assert ParentRequest("req", SamplingParams(n=3)).child_sampling_params(2).seed is None
    assert ParentRequest("req", SamplingParams(seed=2**63 - 1, n=2)).child_sampling_params(1).seed == -(2**63)
    assert ParentRequest("solo", SamplingParams()).child_request_id(0) == "solo"


async def test_merge_interleaves_and_closing_it_closes_every_child() -> None:
    closed: list[int] = []

    async def child(index: int, num_outputs: int) -> AsyncGenerator[RequestOutput, None]:
        try:
            for step in range(num_outputs):
                await asyncio.sleep(0)
                yield RequestOutput(str(index), None, [], [CompletionOutput(0, f"{index}.{step}", [step])])
        finally:
            closed.append(index)

    merged = merge_streams([child(0, 2), child(1, 3)])
    items = [(index, output.outputs[0].text) async for index, output in merged]
    assert sorted(items) == [(0, "0.0"), (0, "0.1"), (1, "1.0"), (1, "1.1"), (1, "1.2")]
    closed.clear()
    merged = merge_streams([child(0, 100), child(1, 100)])
    await merged.__anext__()
    await merged.aclose()
    assert sorted(closed) == [0, 1]
    closed.clear()
    solo = merge_streams([child(7, 100)])
    await solo.__anext__()
    await solo.aclose()
    assert closed == [7]
