"""Runs the stored batches (service/openai/batch_store.py) through the server's engine, one batch at a
time, oldest first, and continues them after a restart.

Each line goes the way `zeroserve generate`'s do (service/openai/batch_generate.py: read, checked,
prepared by the routes' Preparer, answered by their builders); only the loop is this one's. Batch
lines yield to interactive requests in two ways: their engine requests carry `priority`
BATCH_PRIORITY (under --scheduling-policy priority, interactive requests, priority 0, go first and
preempt them), and, since the default policy fcfs orders by arrival alone, at most `max_in_flight`
lines are in the engine at once, fewer than its --max-num-seqs, so an interactive request always
finds a seat in the running batch instead of queueing behind a whole file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from service.frontend.outputs import collect
from service.openai.batch_generate import answer_result, error_result, read_line
from service.openai.batch_store import BatchStore, now
from service.openai.errors import APIError

if TYPE_CHECKING:
    from service.api.server_state import ServerState

logger = logging.getLogger(__name__)

# Lower `priority` values go first; an interactive request's default is 0.
BATCH_PRIORITY = 1
POLL_S = 0.5
RETRY_S = 5.0


class BatchWorker:
    """The one task that answers the stored batches' lines, `max_in_flight` at a time."""

    def __init__(self, store: BatchStore, max_in_flight: int) -> None:
        self.store = store
        self.max_in_flight = max_in_flight
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, states: StateSource) -> None:
        """Runs the batches from now on, each line on the state (engine client, preparer) of the model it names."""
        self._task = asyncio.create_task(self._run(states), name="batch-worker")

    def wake(self) -> None:
        """A batch was created or cancelled: look now, not at the next poll."""
        self._wake.set()

    async def close(self) -> None:
        """Stops; lines in flight are aborted in the engine and answered again after a restart."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, states: StateSource) -> None:
        while True:
            batch = await asyncio.to_thread(self.store.next_unfinished)
            if batch is None:
                await self._sleep(POLL_S)
                continue
            try:
                await self._run_batch(states, batch)
            except Exception:
                # NOTE: the engine failed or is gone; its unanswered lines run again once it serves.
                logger.exception("batch %s stopped; retrying in %g s", batch["id"], RETRY_S)
                await asyncio.sleep(RETRY_S)

    async def _sleep(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        self._wake.clear()

    async def _run_batch(self, states: StateSource, batch: dict[str, Any]) -> None:
        """Answers the batch's unanswered lines, then makes its output and error files."""
        store, batch_id = self.store, batch["id"]
        if batch["status"] == "validating":
            started = await asyncio.to_thread(
                store.update_batch, batch_id, {"status": "in_progress", "in_progress_at": now()}, ("validating",)
            )
            batch = started or batch
        if batch["status"] == "in_progress":
            content = await asyncio.to_thread(store.file_content, batch["input_file_id"])
            if content is None:
                error = {"code": "input_file_deleted", "message": "The batch's input file was deleted.", "line": None}
                await asyncio.to_thread(store.update_batch, batch_id, {
                    "status": "failed", "failed_at": now(), "errors": {"object": "list", "data": [error]},
                })
                return
            answered = await asyncio.to_thread(store.answered_lines, batch_id)
            lines = [(i, text) for i, text in numbered_lines(content) if i not in answered]
            if not await self._answer_lines(states, batch, lines):
                return
            await asyncio.to_thread(
                store.update_batch, batch_id, {"status": "finalizing", "finalizing_at": now()}, ("in_progress",)
            )
        current = await asyncio.to_thread(store.batch, batch_id)
        batch = current or batch
        if batch["status"] == "cancelling":
            await asyncio.to_thread(store.finish_batch, batch_id, {"status": "cancelled", "cancelled_at": now()})
        elif batch["status"] == "finalizing":
            await asyncio.to_thread(store.finish_batch, batch_id, {"status": "completed", "completed_at": now()})

    async def _answer_lines(self, states: StateSource, batch: dict[str, Any], lines: list[tuple[int, str]]) -> bool:
        """Answers `lines`, `max_in_flight` at once, keeping each result as it comes; False (and the
        lines in flight aborted) once the batch is no longer in progress."""
        pending = iter(lines)

        async def answer_each() -> None:
            for index, text in pending:
                result, is_error = await self._answer(states, batch["endpoint"], index, text)
                await asyncio.to_thread(self.store.add_result, batch["id"], index, result, is_error)

        tasks = [asyncio.create_task(answer_each()) for _ in range(min(self.max_in_flight, len(lines)))]
        try:
            while tasks:
                done, _ = await asyncio.wait(tasks, timeout=POLL_S, return_when=asyncio.FIRST_EXCEPTION)
                for task in done:
                    task.result()  # NOTE: a line that failed (the engine gone) stops the batch here.
                if len(done) == len(tasks):
                    break
                current = await asyncio.to_thread(self.store.batch, batch["id"])
                if current is None or current["status"] != "in_progress":
                    return False
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return True

    async def _answer(self, states: StateSource, endpoint: str, index: int, text: str) -> tuple[dict[str, Any], bool]:
        """A line's result, and whether it is an error: prepared as the route prepares a body, at
        BATCH_PRIORITY, and answered whole by the model it names."""
        custom_id = None
        try:
            line = read_line(index, text)
            custom_id = line.custom_id
            body = line.request_body(endpoint)
            body.priority = max(body.priority, BATCH_PRIORITY)
        except APIError as error:
            return error_result(index, custom_id, error), True
        try:
            async with states(body.model) as state:
                try:
                    prepared = await state.preparer.prepare(body, line.ids(body))
                except APIError as error:
                    return error_result(index, custom_id, error), True
                outputs = state.llm.generate(prepared.engine_requests, prepared.params)
                whole = await collect(outputs, len(prepared.prompts), body.n)
                result = answer_result(
                    line, body, prepared, whole, state.llm.tokenizer, state.tool_call_parser, state.reasoning_parser
                )
        except APIError as error:
            # NOTE: the model it names is not served, or failed to load.
            return error_result(index, custom_id, error), True
        return result, False


# NOTE: the state a line runs on, by the model it names: the one model's, or a multi-model gateway's pool's.
StateSource = Callable[[str | None], "AbstractAsyncContextManager[ServerState]"]


def fixed_state(state: ServerState) -> StateSource:
    """The source of a one-model gateway: every line runs on `state` (its preparer checks the name)."""

    @contextlib.asynccontextmanager
    async def lease(model: str | None) -> AsyncIterator[ServerState]:
        yield state

    return lease


def numbered_lines(content: bytes) -> list[tuple[int, str]]:
    """A JSONL file's lines that are not blank, each with its place in the file."""
    text = content.decode("utf-8", errors="replace")
    return [(index, line) for index, line in enumerate(text.splitlines()) if line.strip()]
