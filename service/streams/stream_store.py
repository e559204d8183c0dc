"""Resumable streams (--stream-retention): each streamed answer's SSE events are kept, numbered by
their `id:`, while the request generates on without its client; a client that lost its connection
reads the events after its `Last-Event-ID`, then the live rest. Finished streams stay for the
retention window, within a memory bound."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

logger = logging.getLogger(__name__)

# NOTE: how often kept streams are checked for the end of their window.
_SWEEP_INTERVAL_S = 1.0
# NOTE: the clock windows are counted on, looked up at each reading: tests stand in one they move
# themselves, so whether a stream is still kept never depends on how busy the machine is.
clock: Callable[[], float] = time.monotonic


class StreamLog:
    """One stream's encoded events so far, in order (an event's id is its position)."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        self.events: list[bytes] = []
        self.num_bytes = 0
        self.is_finished = False
        self.num_readers = 0
        # NOTE: when its window started: the end of the stream, or before that the last reader leaving
        # (or its start, until a first reader comes).
        self.idle_since: float | None = clock()
        self.producer: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def append(self, event: bytes) -> None:
        self.events.append(event)
        self.num_bytes += len(event)
        self._changed.set()

    def finish(self) -> None:
        self.is_finished = True
        self.idle_since = clock()
        self._changed.set()

    async def follow(self, after_id: int) -> AsyncIterator[bytes]:
        """The events after `after_id` (-1: all), then each new one until the stream ends."""
        self.num_readers += 1
        if not self.is_finished:
            self.idle_since = None
        try:
            position = after_id + 1
            while True:
                while position < len(self.events):
                    yield self.events[position]
                    position += 1
                if self.is_finished:
                    return
                self._changed.clear()
                await self._changed.wait()
        finally:
            self.num_readers -= 1
            if self.num_readers == 0 and not self.is_finished:
                self.idle_since = clock()


class StreamStore:
    """The kept streams of one gateway process, by request id (the response's id, and the
    client's X-Request-Id when it sent one)."""

    def __init__(self, retention_s: float, max_bytes: int) -> None:
        self.retention_s = retention_s
        self.max_bytes = max_bytes
        self.logs: dict[str, StreamLog] = {}
        self._sweeper: asyncio.Task[None] | None = None

    @property
    def is_enabled(self) -> bool:
        return self.retention_s > 0

    @property
    def num_bytes(self) -> int:
        return sum(log.num_bytes for log in set(self.logs.values()))

    def get(self, key: str) -> StreamLog | None:
        return self.logs.get(key)

    def start(self, keys: list[str], events: AsyncIterator[bytes], on_finish: Callable[[], None]) -> StreamLog:
        """Generates `events` into a new kept stream, whoever reads it; `on_finish` runs when it
        ends (the request's admission slot goes with the stream, not with its first connection)."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_forever(), name="stream-retention")
        log = StreamLog(keys)
        for key in keys:
            self.logs[key] = log
        log.producer = asyncio.create_task(self._produce(log, events, on_finish), name=f"stream-{keys[0]}")
        self._evict()
        return log

    async def _produce(self, log: StreamLog, events: AsyncIterator[bytes], on_finish: Callable[[], None]) -> None:
        try:
            async for event in events:
                log.append(event)
        finally:
            log.finish()
            on_finish()

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL_S)
            self.sweep()

    def sweep(self) -> None:
        """Drops the streams that ended a window ago, and aborts those that generated a window with
        no client reading."""
        now = clock()
        for log in set(self.logs.values()):
            if log.idle_since is not None and now - log.idle_since >= self.retention_s and (
                log.is_finished or log.num_readers == 0
            ):
                self._drop(log, "no client came back within --stream-retention")
        self._evict()

    def _evict(self) -> None:
        """Past the memory bound, drops finished streams nobody reads, oldest first, then the
        unread ones still generating."""
        if self.num_bytes <= self.max_bytes:
            return
        idle = sorted(
            (log for log in set(self.logs.values()) if log.num_readers == 0),
            key=lambda log: (not log.is_finished, log.idle_since or 0.0),
        )
        for log in idle:
            self._drop(log, "over --stream-retention-memory")
            if self.num_bytes <= self.max_bytes:
                return

    def cancel(self, key: str) -> bool:
        """Aborts the stream `key` names (its request stops generating) and forgets it; False
        when no such stream is kept."""
        log = self.logs.get(key)
        if log is None:
            return False
        self._drop(log, "its client cancelled it")
        return True

    def _drop(self, log: StreamLog, reason: str) -> None:
        for key in log.keys:
            if self.logs.get(key) is log:
                del self.logs[key]
        if log.producer is not None and not log.producer.done():
            logger.info("stream %s aborted: %s", log.keys[0], reason)
            log.producer.cancel()

    async def close(self) -> None:
        for log in set(self.logs.values()):
            self._drop(log, "the server is stopping")
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
