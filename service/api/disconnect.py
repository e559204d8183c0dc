"""Non-streamed answers end with their client: a closed connection cancels the work (aborting its
requests in the engine) instead of letting it run to the end for nobody."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed its connection before its answer was ready."""


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result; if the client disconnects first, cancels `work` and raises ClientDisconnected.

    Call it once the body has been read: the next ASGI message is then `http.disconnect`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        # NOTE: a cancelled route (a timeout, a drain) takes both with it.
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        watcher.cancel()
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
