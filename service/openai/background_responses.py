"""Responses answered detached (`background: true`): each a task of this gateway process that keeps its
Response as its status moves on (queued, in_progress, then completed, incomplete, failed or cancelled),
holding an admission slot while it runs, so a drain waits for it. Kept responses are written through
`keeper`: added once, then updated while unfinished."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from service.openai.errors import APIError
from service.openai.response_store import ResponseExistsError, ResponseStore

logger = logging.getLogger(__name__)

Keep = Callable[[dict[str, Any]], Awaitable[None]]


class Slots(Protocol):
    """What a detached answer needs of the gateway's admission: a slot held while it runs."""

    def acquire(self) -> None: ...

    def release(self) -> None: ...


def keeper(store: ResponseStore | None, input_items: list[dict[str, Any]]) -> Keep:
    """Keeps one response as it changes: added the first time, then updated while it is unfinished (a
    cancel or delete stored meanwhile stays); nothing without a store."""
    is_added = False

    async def keep(answer: dict[str, Any]) -> None:
        nonlocal is_added
        if store is None:
            return
        if is_added:
            await asyncio.to_thread(store.update, answer)
            return
        is_added = True
        try:
            await asyncio.to_thread(store.add, answer, input_items)
        except ResponseExistsError as error:
            logger.warning("response not kept: %s", error)

    return keep


class BackgroundResponses:
    """This process's background responses that have not finished, by id."""

    def __init__(self) -> None:
        self.running: dict[str, asyncio.Task[None]] = {}

    async def start(
        self, base: dict[str, Any], keep: Keep, answer: Callable[[], Awaitable[dict[str, Any]]], slots: Slots
    ) -> dict[str, Any]:
        """The response queued (kept), its `answer` running detached."""
        queued = base | {"status": "queued"}
        await keep(queued)
        response_id = base["id"]
        task = asyncio.create_task(self._answer(base, keep, answer, slots))
        self.running[response_id] = task
        task.add_done_callback(lambda _: self.running.pop(response_id, None))
        return queued

    async def stop(self, response_id: str) -> None:
        """Cancels the response's task, if it runs in this process, and waits for it to end."""
        task = self.running.get(response_id)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])

    @staticmethod
    async def _answer(
        base: dict[str, Any], keep: Keep, answer: Callable[[], Awaitable[dict[str, Any]]], slots: Slots
    ) -> None:
        slots.acquire()
        try:
            await keep(base)
            await keep(await answer())
        except APIError as error:
            await keep(base | {"status": "failed", "error": {"code": error.code or error.error_type,
                                                             "message": error.message}})
        except Exception as error:  # noqa: BLE001 - a background response ends failed, never in_progress
            logger.warning("background response %s failed: %s", base["id"], error)
            await keep(base | {"status": "failed", "error": {"code": "server_error", "message": str(error)}})
        finally:
            slots.release()
