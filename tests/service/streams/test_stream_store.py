"""The kept streams' store alone (no HTTP): its memory bound lets the finished streams nobody reads go first."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from service.streams.stream_store import StreamStore


async def until(condition: Callable[[], bool]) -> None:
    """Lets the event loop run until `condition()` holds (a minute at most)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0)


async def test_past_the_memory_bound_streams_nobody_reads_go_finished_first() -> None:
    store = StreamStore(retention_s=60.0, max_bytes=250)

    async def events(count: int, gate: asyncio.Event | None = None) -> AsyncIterator[bytes]:
        for i in range(count):
            if gate is not None and i == 1:
                await gate.wait()
            yield b"x" * 50

    released: list[str] = []
    old = store.start(["old"], events(2), lambda: released.append("old"))
    await until(lambda: old.is_finished)
    gate = asyncio.Event()
    live = store.start(["live"], events(3, gate), lambda: released.append("live"))
    newer = store.start(["newer"], events(2), lambda: released.append("newer"))
    await until(lambda: newer.is_finished and len(live.events) == 1)
    assert not live.is_finished
    reader = live.follow(-1)
    assert await anext(reader) == b"x" * 50
    big = store.start(["big"], events(3), lambda: released.append("big"))
    await until(lambda: big.is_finished)
    store.sweep()
    # NOTE: 100 + 50 + 100 + 150 bytes: the oldest finished ("old"), then "newer", go; the read one stays.
    assert store.get("old") is None and store.get("newer") is None
    assert store.get("live") is live and store.get("big") is big and store.num_bytes <= 250
    gate.set()
    assert [event async for event in reader] == [b"x" * 50] * 2
    await store.close()
    assert sorted(released) == ["big", "live", "newer", "old"]
