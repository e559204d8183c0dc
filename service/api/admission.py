"""Admission: the gateway's phase (loading, serving, draining), its cap on requests in flight,
and the deadline that ends a request's stream (its timeout, or the end of a drain)."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.errors import error_response
from service.frontend.outputs import CompletionOutput, RequestOutput
from service.openai.errors import APIError, RequestTimeoutError

if TYPE_CHECKING:
    from service.openai.prepare import Prepared

RETRY_AFTER_S = 1
# (paths, prefixes): a set of routes, fixed paths and the prefixes of templated ones.
Paths = tuple[frozenset[str], tuple[str, ...]]


def is_among(path: str, paths: Paths) -> bool:
    return path in paths[0] or path.startswith(paths[1])


@dataclass(frozen=True)
class PathRules:
    """The routes each middleware treats apart, derived from the route table (routes.py's `path_rules`)."""

    keyless: Paths  # answered without an API key
    open_while_loading: Paths  # served before the model is ready
    open_while_draining: Paths  # served while the server shuts down
    generation: frozenset[str]  # generations: counted in flight and capped
    model_routed: frozenset[str]  # bodies that name the model they run on
    anthropic: tuple[str, ...]  # errors in Anthropic's shape (these paths and those under them)


class Phase(enum.Enum):
    """Where the gateway is in its life; only SERVING admits every route."""

    LOADING = "loading"
    SERVING = "serving"
    DRAINING = "draining"


class Admission:
    """Which requests the gateway takes now, how many are in flight, and when their streams end."""

    def __init__(
        self,
        max_num_in_flight: int | None = None,
        request_timeout_s: float | None = None,
        max_header_bytes: int | None = None,
    ) -> None:
        self.max_num_in_flight = max_num_in_flight
        self.request_timeout_s = request_timeout_s
        self.max_header_bytes = max_header_bytes
        self.phase = Phase.LOADING
        self.num_in_flight = 0
        self.is_aborting = False
        self._idle = asyncio.Event()
        self._idle.set()
        self._timeouts: set[asyncio.Timeout] = set()
        # NOTE: told of each 429 (the metrics' admission_rejections), once the metrics exist.
        self.on_rejection: Callable[[str], None] | None = None

    def refusal(self, path: str, rules: PathRules, num_header_bytes: int = 0) -> Response | None:
        """The answer to a request for `path` that is not admitted now, or None to admit it."""
        if self.max_header_bytes is not None and num_header_bytes > self.max_header_bytes:
            return error_response(APIError(f"The request's headers are larger than {self.max_header_bytes} bytes.",
                                           431, code="request_header_fields_too_large"))
        if self.phase is Phase.LOADING and not is_among(path, rules.open_while_loading):
            response = error_response(APIError("The model is loading; retry shortly.", 503,
                                               error_type="server_error", code="model_loading"))
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            return response
        if self.phase is Phase.DRAINING and not is_among(path, rules.open_while_draining):
            return error_response(APIError("The server is shutting down.", 503, error_type="server_error",
                                           code="server_shutting_down"))
        if (
            path in rules.generation and self.max_num_in_flight is not None
            and self.num_in_flight >= self.max_num_in_flight
        ):
            response = error_response(APIError(
                f"The server has {self.num_in_flight} requests in flight, its limit; retry later.", 429,
                error_type="requests", code="rate_limit_exceeded",
            ))
            response.headers["Retry-After"] = str(RETRY_AFTER_S)
            if self.on_rejection is not None:
                self.on_rejection("max_num_queued_reqs")
            return response
        return None

    def acquire(self) -> None:
        self.num_in_flight += 1
        self._idle.clear()

    def release(self) -> None:
        self.num_in_flight -= 1
        if self.num_in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Waits up to `timeout_s` for no request to be in flight; True if none is."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def abort_all(self) -> None:
        """Ends every stream now (and every later one at once): the end of a drain."""
        self.is_aborting = True
        now = asyncio.get_running_loop().time()
        for timeout in list(self._timeouts):
            if not timeout.expired():  # NOTE: an expiring one cannot be rescheduled; it ends anyway.
                timeout.reschedule(now)

    async def guarded(
        self, outputs: AsyncGenerator[tuple[int, RequestOutput], None], prepared: Prepared
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """A prepared request's outputs, (choice index, delta), within its `guard`. A constrained
        request waits for its first output: a grammar the engine could not compile (in time) is a
        400 naming the constraint."""
        guarded = self.guard(outputs, len(prepared.engine_requests))
        if prepared.params.structured_output is None:
            return guarded
        return await _checked_first(guarded, prepared.constraint_param)

    async def guard(
        self, outputs: AsyncGenerator[tuple[int, RequestOutput], None], num_choices: int
    ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """Yields `outputs` until they end. Past the request's timeout, or when the drain aborts
        it, closes them (which aborts the engine requests), ends each unfinished choice with
        finish_reason "abort" and raises the APIError saying why."""
        loop = asyncio.get_running_loop()
        deadline = None if self.request_timeout_s is None else loop.time() + self.request_timeout_s
        request_ids = [""] * num_choices
        unfinished = set(range(num_choices))
        try:
            while not self.is_aborting:
                try:
                    async with asyncio.timeout_at(deadline) as timeout:
                        self._timeouts.add(timeout)
                        try:
                            index, output = await anext(outputs)
                        finally:
                            self._timeouts.discard(timeout)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    break
                request_ids[index] = output.request_id
                if output.finished:
                    unfinished.discard(index)
                yield index, output
        finally:
            await outputs.aclose()
        for index in sorted(unfinished):
            yield index, _aborted_output(request_ids[index])
        raise self._abort_error()

    def _abort_error(self) -> APIError:
        if self.is_aborting:
            return APIError("The server shut down before the request finished.", 503, error_type="server_error",
                            code="server_shutting_down")
        # NOTE: not `invalid_request_error`: the request was valid, the server's time limit ended it. OpenAI
        # names no type for a 408; `timeout_error` is the one other OpenAI-style APIs give it.
        return RequestTimeoutError(f"The request ran longer than the server's request timeout "
                                   f"({self.request_timeout_s:g} s) and was aborted.", 408,
                                   error_type="timeout_error", code="request_timeout")


async def _checked_first(
    outputs: AsyncGenerator[tuple[int, RequestOutput], None], param: str
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """`outputs`, once the first has come; a first output that is the engine's error (its grammar
    did not compile) is a 400 naming `param` instead."""
    try:
        first = await anext(outputs)
    except StopAsyncIteration:
        return outputs
    completion = first[1].outputs[0] if first[1].outputs else None
    if completion is not None and completion.finish_reason == "error" and not completion.token_ids:
        await outputs.aclose()
        raise APIError(f"'{param}' could not be used: {completion.stop_reason}.", param=param)
    return _chained(first, outputs)


async def _chained(
    first: tuple[int, RequestOutput], outputs: AsyncGenerator[tuple[int, RequestOutput], None]
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    try:
        yield first
        async for item in outputs:
            yield item
    finally:
        await outputs.aclose()


def _aborted_output(request_id: str) -> RequestOutput:
    return RequestOutput(request_id, None, [], [CompletionOutput(0, "", [], finish_reason="abort")], finished=True)


async def refuse(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
    """Sends a refusal without reading the request's body, and then closes the connection."""
    # NOTE: with the body unread the connection cannot carry another request; a client told
    # nothing would send its next one there and find the connection closed under it.
    response.headers["Connection"] = "close"
    await response(scope, receive, send)


class AdmissionMiddleware:
    """Refuses what `Admission` does not admit (431 headers too large, 503 loading or draining,
    429 with Retry-After past the cap) before the body is read, and counts generation requests
    until their response ends."""

    def __init__(self, app: ASGIApp, admission: Admission, rules: PathRules) -> None:
        self.app = app
        self.admission = admission
        self.rules = rules

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        # NOTE: hypercorn caps only a head that arrives in pieces; one read of 64 KiB passes whole.
        num_header_bytes = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
        refusal = self.admission.refusal(path, self.rules, num_header_bytes)
        if refusal is not None:
            await refuse(refusal, scope, receive, send)
            return
        if path not in self.rules.generation:
            await self.app(scope, receive, send)
            return
        self.admission.acquire()
        try:
            await self.app(scope, receive, send)
        finally:
            # NOTE: a kept stream (--stream-retention) took the slot over: it releases it when it ends.
            if not scope.get("state", {}).get("is_handed_off"):
                self.admission.release()
