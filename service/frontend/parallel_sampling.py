"""n > 1 by fan-out: one parent request, n child engine requests, one merged stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from proto import engine_input
from service.frontend.outputs import RequestOutput
from service.frontend.sampling_params import SamplingParams

_INT64 = 2**63


class ParentRequest:
    """An API request's n samples: each child has its own id and, when seeded, its own seed."""

    def __init__(self, request_id: str, sampling_params: SamplingParams) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.n = sampling_params.n

    def child_request_id(self, index: int) -> str:
        return self.request_id if self.n == 1 else f"{self.request_id}-{index}"

    def child_sampling_params(self, index: int) -> engine_input.SamplingParams:
        """What child i's engine request samples with: a request seeded s draws with seed s + i,
        distinct and the same every time."""
        seed = self.sampling_params.seed
        if seed is None or index == 0:
            return self.sampling_params.engine_params()
        return self.sampling_params.engine_params(seed=(seed + index + _INT64) % (2 * _INT64) - _INT64)


async def merge_streams(
    streams: Sequence[AsyncGenerator[RequestOutput, None]],
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """Yields (stream index, output) as each stream produces them; closing it closes them all
    (which aborts their requests in the engine)."""
    if len(streams) == 1:
        try:
            async for output in streams[0]:
                yield 0, output
        finally:
            await streams[0].aclose()
        return
    queue: asyncio.Queue[tuple[int, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def drain(index: int, stream: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
            queue.put_nowait(None)
        except Exception as error:  # noqa: BLE001 - handed to the consumer
            queue.put_nowait(error)

    tasks = [asyncio.create_task(drain(i, s)) for i, s in enumerate(streams)]
    try:
        num_done = 0
        while num_done < len(tasks):
            item = await queue.get()
            if item is None:
                num_done += 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
