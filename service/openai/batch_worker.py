"""Runs the stored batches (service/openai/batch_store.py) through the server's engine, one batch at a
time, oldest first, and continues them after a restart.

Each line goes the way `zeroserve generate`'s do (service/openai/batch_generate.py: read, checked,
prepared by the routes' Preparer, answered by their builders); only the loop is this one's. Batch
lines yield to interactive requests in two ways: their engine requests carry `priority`
BATCH_PRIORITY (under --scheduling-policy priority, interactive requests, priority 0, go first and
preempt them), and, since the default policy fcfs orders by arrival alone, at most `max_in_flight`
lines are in the engine at once, fewer than its --max-num-seqs, so an interactive request always
finds a seat in the running batch instead of queueing behind a whole file.

A line runs at most --request-timeout (its result then a 408). A batch past its `expires_at` stops:
"expired", its answered lines kept, the others in its error file as `batch_expired`. A batch whose
engine keeps failing is tried MAX_ATTEMPTS times, then "failed" with the lines answered by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from service.client.core_client import EngineDeadError
from service.frontend.outputs import collect
from service.openai.batch_generate import BatchEndpoints, LineError, answer_result, error_result, read_line
from service.openai.batch_store import BatchStore, now
from service.openai.errors import APIError, RequestTimeoutError

if TYPE_CHECKING:
    from service.frontend.async_llm import AsyncLLM
    from service.openai.prepare import Preparer

logger = logging.getLogger(__name__)

# Lower `priority` values go first; an interactive request's default is 0.
BATCH_PRIORITY = 1
POLL_S = 0.5
RETRY_S = 5.0
# NOTE: tries of a batch whose engine fails (a restarted engine serves within seconds; a model that cannot does not).
MAX_ATTEMPTS = 5
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


class ModelState(Protocol):
    """What a line needs of the model it names (the HTTP routes' ServerState is one): its engine, its preparer
    of bodies, and the parsers its answers are read with."""

    llm: AsyncLLM
    preparer: Preparer
    tool_call_parser: str | None
    reasoning_parser: str | None


class BatchWorker:
    """The one task that answers the stored batches' lines, `max_in_flight` at a time."""

    def __init__(
        self, store: BatchStore, endpoints: BatchEndpoints, max_in_flight: int, request_timeout_s: float | None = None
    ) -> None:
        self.store = store
        self.endpoints = endpoints
        self.max_in_flight = max_in_flight
        self.request_timeout_s = request_timeout_s
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
        attempts: dict[str, int] = {}
        while True:
            batch = await asyncio.to_thread(self.store.next_unfinished)
            if batch is None:
                await self._sleep(POLL_S)
                continue
            try:
                await self._run_batch(states, batch)
            except Exception as error:
                # NOTE: the engine failed or is gone; its unanswered lines run again once it serves, a few times.
                num_attempts = attempts[batch["id"]] = attempts.get(batch["id"], 0) + 1
                if num_attempts >= MAX_ATTEMPTS:
                    logger.error("batch %s failed %d times, the last: %s", batch["id"], num_attempts, error)
                    await asyncio.to_thread(self._fail, batch, f"The batch failed {num_attempts} times: {error}")
                    continue
                logger.exception("batch %s stopped; retrying in %g s", batch["id"], RETRY_S)
                await asyncio.sleep(RETRY_S)

    def _fail(self, batch: dict[str, Any], message: str) -> None:
        """Ends a batch that cannot run: "failed", with the lines answered so far in its files."""
        error = {"code": "batch_failed", "message": message, "line": None, "param": None}
        self.store.finish_batch(batch["id"], {
            "status": "failed", "failed_at": now(), "errors": {"object": "list", "data": [error]},
        }, only_from=("validating", "in_progress", "finalizing"))

    def _expire(self, batch: dict[str, Any]) -> None:
        """Ends a batch past its window: "expired", its unanswered lines in its error file as OpenAI's
        `batch_expired`, its answered ones kept."""
        store, batch_id = self.store, batch["id"]
        content = store.file_content(batch["input_file_id"]) or b""
        answered = store.answered_lines(batch_id)
        for index, text in numbered_lines(content):
            if index not in answered:
                custom_id = _custom_id(text)
                store.add_result(batch_id, index, error_result(index, custom_id, LineError(
                    EXPIRED_MESSAGE, code="batch_expired")), is_error=True)
        store.finish_batch(batch_id, {"status": "expired", "expired_at": now()}, only_from=("validating", "in_progress"))

    async def _sleep(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        self._wake.clear()

    async def _run_batch(self, states: StateSource, batch: dict[str, Any]) -> None:
        """Answers the batch's unanswered lines, then makes its output and error files."""
        store, batch_id = self.store, batch["id"]
        if _is_past_window(batch) and batch["status"] in ("validating", "in_progress"):
            await asyncio.to_thread(self._expire, batch)
            return
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
                if _is_past_window(batch):
                    await asyncio.to_thread(self._expire, batch)
                return
            await asyncio.to_thread(
                store.update_batch, batch_id, {"status": "finalizing", "finalizing_at": now()}, ("in_progress",)
            )
        current = await asyncio.to_thread(store.batch, batch_id)
        batch = current or batch
        # NOTE: each from its status only: a cancel stored meanwhile (another gateway process) is never undone.
        if batch["status"] == "cancelling":
            await asyncio.to_thread(
                store.finish_batch, batch_id, {"status": "cancelled", "cancelled_at": now()}, ("cancelling",)
            )
        elif batch["status"] == "finalizing":
            await asyncio.to_thread(
                store.finish_batch, batch_id, {"status": "completed", "completed_at": now()}, ("finalizing",)
            )

    async def _answer_lines(self, states: StateSource, batch: dict[str, Any], lines: list[tuple[int, str]]) -> bool:
        """Answers `lines`, `max_in_flight` at once, keeping each result as it comes; False (and the
        lines in flight aborted) once the batch is no longer in progress, or past its window."""
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
                if current is None or current["status"] != "in_progress" or _is_past_window(batch):
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
            body = line.request_body(self.endpoints, endpoint)
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
                try:
                    async with asyncio.timeout(self.request_timeout_s):
                        whole = await collect(outputs, len(prepared.prompts), body.n)
                except TimeoutError:
                    return error_result(index, custom_id, RequestTimeoutError(
                        f"The line ran longer than the server's request timeout ({self.request_timeout_s:g} s, "
                        "--request-timeout) and was aborted.", 408, error_type="timeout_error", code="request_timeout",
                    )), True
                result = answer_result(
                    line, body, prepared, whole, state.llm.tokenizer, state.tool_call_parser, state.reasoning_parser
                )
        except APIError as error:
            # NOTE: the model it names is not served, or failed to load.
            return error_result(index, custom_id, error), True
        except EngineDeadError:
            raise  # NOTE: the batch stops and runs again once the engine serves.
        except Exception as error:  # NOTE: one line's fault is its own result, not the batch's.
            logger.exception("batch line %d failed", index)
            return error_result(index, custom_id, APIError(
                f"The server failed to answer this line: {error}", 500, error_type="server_error", code="server_error",
            )), True
        return result, False


# NOTE: the state a line runs on, by the model it names: the one model's, or a multi-model gateway's pool's.
StateSource = Callable[[str | None], "AbstractAsyncContextManager[ModelState]"]


def fixed_state(state: ModelState) -> StateSource:
    """The source of a one-model gateway: every line runs on `state` (its preparer checks the name)."""

    @contextlib.asynccontextmanager
    async def lease(model: str | None) -> AsyncIterator[ModelState]:
        yield state

    return lease


def _is_past_window(batch: dict[str, Any]) -> bool:
    return batch.get("expires_at") is not None and now() >= batch["expires_at"]


def _custom_id(text: str) -> str | None:
    """A line's custom_id, where it has one."""
    try:
        return read_line(0, text).custom_id
    except APIError:
        return None


def numbered_lines(content: bytes) -> list[tuple[int, str]]:
    """A JSONL file's lines that are not blank, each with its place in the file."""
    text = content.decode("utf-8", errors="replace")
    return [(index, line) for index, line in enumerate(text.splitlines()) if line.strip()]
