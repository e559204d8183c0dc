"""AsyncMPClient: the gateway's ZeroMQ link to its engine processes, on asyncio."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import zmq
import zmq.asyncio

from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, RequestType
from proto.engine_output import EngineCoreOutputs
from proto.handshake import EngineReady
from service.client.core_client import EngineDeadError
from service.client.curve import LinkSettings
from service.client.engine_launcher import EngineProcess, RestartBudget
from service.client.engine_state import DeathNotice, EngineLost
from service.client.mp_client import MPClient, utility_outcome

logger = logging.getLogger(__name__)

OutputItem = EngineCoreOutputs | EngineLost | BaseException


class AsyncMPClient(MPClient):
    """One task moves decoded outputs from the PULL socket to `outputs_queue`; with several
    engines (data parallel), each request goes to the least-loaded one."""

    input_socket: zmq.asyncio.Socket
    output_socket: zmq.asyncio.Socket

    def __init__(
        self,
        engine_config: EngineConfig,
        data_parallel_size: int = 1,
        link: LinkSettings | None = None,
        engine_addresses: tuple[str, str] | None = None,
        log_format: str = "text",
    ) -> None:
        self.outputs_queue: asyncio.Queue[OutputItem] = asyncio.Queue()
        self._dead = asyncio.Event()
        self._utility_calls: dict[int, asyncio.Future[Any]] = {}
        self._utility_owner: dict[int, int] = {}
        self._loop = asyncio.get_running_loop()
        self._tasks: list[asyncio.Task[None]] = []
        # NOTE: resumed requests waiting for a serving engine: request id → (request, give-up time).
        self._parked: dict[str, tuple[EngineCoreRequest, float]] = {}
        self._restart_budget = RestartBudget()
        self._is_restarting: set[int] = set()
        super().__init__(engine_config, zmq.asyncio.Context(), data_parallel_size, link, engine_addresses, log_format)

    async def wait_ready(self, timeout: float = 300.0) -> EngineReady:
        """Waits for every local engine's ready message, up to `timeout` seconds each; with none, for
        the first remote one, however long it takes."""
        # NOTE: a remote engine joins whenever it is started, and a slow one (an emulated CPU, a busy
        # host) may take minutes to load: a gateway that gave up on it would exit, refusing the
        # connections of clients polling its /health (503 waiting_for_engine meanwhile).
        wait_s = timeout if self.data_parallel_size else None
        dead = asyncio.ensure_future(self._dead.wait())
        try:
            while len(self.alive_engines) < max(self.data_parallel_size, 1):
                recv = asyncio.ensure_future(self.input_socket.recv_multipart())
                done, _ = await asyncio.wait({recv, dead}, timeout=wait_s, return_when=asyncio.FIRST_COMPLETED)
                if recv not in done:
                    recv.cancel()
                    reason = self.start_error()
                    raise EngineDeadError(reason or "the engine process did not start; see its log above")
                await self._answer(recv.result())
        finally:
            dead.cancel()
        self._tasks += [
            asyncio.create_task(self._process_outputs_socket(), name="outputs-socket"),
            asyncio.create_task(self._process_input_socket(), name="engines-socket"),
            asyncio.create_task(self._monitor_heartbeats(), name="engine-heartbeats"),
        ]
        return self.ready

    async def _answer(self, frames: list[Any]) -> None:
        reply = self._handle_engine_message(frames)
        if reply is not None:
            await self.input_socket.send_multipart(reply)
            for engine in self.alive_engines:
                self._is_restarting.discard(engine.index)
            await self._send_parked()

    @property
    def is_dead(self) -> bool:
        # NOTE: engines another process starts (other hosts, the parent of several gateways) may
        # come back: the gateway waits for them.
        return self._is_dead or (super().is_dead and not self._is_restarting and bool(self.processes))

    @property
    def is_recovering(self) -> bool:
        """True while no engine serves and a lost one is being restarted."""
        return not self._is_dead and not self.alive_engines and bool(self._is_restarting)

    async def _process_input_socket(self) -> None:
        """Engines joining, beating, draining and leaving while the gateway runs."""
        while True:
            await self._answer(await self.input_socket.recv_multipart())

    async def _monitor_heartbeats(self) -> None:
        interval = min(0.5, self.link.heartbeat_timeout_s / 4)
        while True:
            slept_from = time.monotonic()
            await asyncio.sleep(interval)
            if time.monotonic() - slept_from > 2 * interval:
                # NOTE: woken late, the loop was held (a backlog of outputs taken without a yield): the
                # engines' beats may sit unread in their socket. They are judged at the next wake-up.
                continue
            for engine in self._silent_engines():
                self._lose(engine.index, f"no heartbeat for {self.link.heartbeat_timeout_s:g} s")
            self._expire_parked()

    def _engine_died(self, engine_index: int, reason: str) -> None:
        # NOTE: called from the watcher threads as well as from the loop.
        self._loop.call_soon_threadsafe(self._lose, engine_index, reason)

    def _on_engine_exit(self, process: EngineProcess, returncode: int) -> None:
        # NOTE: runs in the process's watcher thread.
        logger.error("engine process %d exited with code %d", process.engine_index, returncode)
        self._loop.call_soon_threadsafe(self._process_exited, process, returncode)

    def _process_exited(self, process: EngineProcess, returncode: int) -> None:
        index = process.engine_index
        if self._is_dead or self.processes[index] is not process:
            return  # NOTE: the gateway is gone, or this is a replaced process's late news.
        self._lose(index, f"engine process exited with code {returncode}")
        if self._is_dead or not self.link.is_engine_restart or index not in self.engines:
            return
        delay = self._restart_budget.delay(index)
        if delay is None:
            self._is_restarting.discard(index)
            logger.error("%s", self._restart_budget.gave_up_line(index))
            if not self.alive_engines and self.link.engine_address is None:
                self._mark_dead(f"engine {index} kept dying")
            return
        self._is_restarting.add(index)
        self._loop.call_later(delay, self._restart, index)

    def _restart(self, index: int) -> None:
        if self._is_dead:
            return
        num_restarts = self._restart_budget.record(index)
        logger.warning("engine %d: starting a new engine process (restart %d)", index, num_restarts)
        self.processes[index] = self._start_engine(index)

    def _replaced(self, engine_index: int) -> None:
        # NOTE: at once (on the loop), before the new process registers under the same index.
        self._lose(engine_index, "a new engine process took its place", is_replaced=True)

    def _lose(
        self, engine_index: int, reason: str, suspect_request_ids: list[str] | None = None, is_replaced: bool = False
    ) -> None:
        if self._is_dead:
            return
        if engine_index not in self.engines:  # NOTE: died before it was ready.
            self._mark_dead(reason)
            return
        lost = self._lose_engine(engine_index, reason, suspect_request_ids)
        if lost is None:
            return
        error = EngineDeadError(lost.reason)
        for call_id, owner in list(self._utility_owner.items()):
            future = self._utility_calls.pop(call_id, None)
            if owner == engine_index and future is not None and not future.done():
                future.set_exception(error)
        is_local = engine_index < len(self.processes)
        if is_local and self.link.is_engine_restart and not is_replaced:
            # NOTE: a hung or failing process is ended now; its exit starts the new one.
            self.processes[engine_index].kill()
        may_recover = (is_local and self.link.is_engine_restart) or self.link.engine_address is not None
        if not self.alive_engines and not may_recover and self.processes:
            self._mark_dead(reason)
        else:
            # NOTE: its requests continue on another engine, or wait for one to come back.
            self.outputs_queue.put_nowait(lost)

    async def resume_requests_async(self, requests: list[EngineCoreRequest]) -> None:
        """Sends a lost engine's requests, each with its output so far, to a serving engine; while
        none serves they wait, for --engine-recovery-timeout at most."""
        give_up = time.monotonic() + self.link.engine_recovery_timeout_s
        for request in requests:
            request.data_parallel_rank = None  # NOTE: the engine it named may be the one lost
            self._parked[request.request_id] = (request, give_up)
        await self._send_parked()

    async def _send_parked(self) -> None:
        if not self._parked or not any(engine.is_routable for engine in self.engines.values()):
            return
        parked, self._parked = self._parked, {}
        for request, _ in parked.values():
            await self.add_request_async(request)

    def _expire_parked(self) -> None:
        now = time.monotonic()
        expired = [request_id for request_id, (_, give_up) in self._parked.items() if give_up <= now]
        if not expired:
            return
        for request_id in expired:
            del self._parked[request_id]
        reason = f"no engine came back within {self.link.engine_recovery_timeout_s:g} s (--engine-recovery-timeout)"
        logger.error("%d requests failed: %s", len(expired), reason)
        self.outputs_queue.put_nowait(EngineLost(-1, expired, reason, can_resume=False))

    def _mark_dead(self, reason: str) -> None:
        self._is_dead = True
        self._dead.set()
        error = EngineDeadError(f"engine is dead: {reason}")
        self.outputs_queue.put_nowait(error)
        for future in self._utility_calls.values():
            if not future.done():
                future.set_exception(error)
        self._utility_calls.clear()

    async def _process_outputs_socket(self) -> None:
        while True:
            frames = await self.output_socket.recv_multipart(copy=False)
            outputs = self._decode_outputs(frames)
            if outputs is None:
                continue
            if isinstance(outputs, DeathNotice):
                self._lose(outputs.engine_index, "the engine core reported a fatal error", outputs.suspect_request_ids)
                continue
            if outputs.utility_output is None:
                engine = self.engines.get(outputs.engine_index)
                if engine is None or not engine.is_alive:
                    continue  # NOTE: a lost engine's last words: its requests already went elsewhere.
                engine.last_seen = time.monotonic()  # NOTE: its outputs show it alive as its beats do.
                await self._drop_stale(outputs)
                self._track(outputs)
                self.outputs_queue.put_nowait(outputs)
                continue
            call_id = outputs.utility_output.call_id
            self._utility_owner.pop(call_id, None)
            future = self._utility_calls.pop(call_id, None)
            if future is not None and not future.done():
                value, error = utility_outcome(outputs.utility_output)
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(value)

    async def _drop_stale(self, outputs: EngineCoreOutputs) -> None:
        """Takes out outputs of requests that moved on from this engine (it was lost, then came
        back still running them) and aborts them there."""
        stale = {
            output.request_id for output in outputs.outputs
            if output.request_id in self._parked or (
                (owner := self.request_owner.get(output.request_id)) is not None and owner.index != outputs.engine_index
            )
        }
        if stale:
            outputs.outputs = [output for output in outputs.outputs if output.request_id not in stale]
            identity = self.engines[outputs.engine_index].identity
            await self.input_socket.send_multipart(self._frames(identity, RequestType.ABORT, sorted(stale)), copy=False)

    async def get_output_async(self) -> EngineCoreOutputs | EngineLost:
        item = await self.outputs_queue.get()
        if isinstance(item, BaseException):
            self.outputs_queue.put_nowait(item)  # NOTE: every later caller sees it too.
            raise item
        return item

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        if self.is_recovering and request.data_parallel_rank is None:
            await self.resume_requests_async([request])  # NOTE: it waits for the restarted engine
            return
        engine = self._route(request)
        try:
            await self.input_socket.send_multipart(self._frames(engine.identity, RequestType.ADD, request), copy=False)
        except BaseException as exc:
            self._owners([request.request_id])
            if not (isinstance(exc, zmq.ZMQError) and exc.errno == zmq.EHOSTUNREACH):
                raise
            # NOTE: the engine's connection is gone (its process died and is not yet seen as lost):
            # the request waits, as a lost engine's requests do, for a serving engine.
            logger.warning("engine %d unreachable: request %s waits for a serving engine", engine.index, request.request_id)
            self._parked[request.request_id] = (request, time.monotonic() + self.link.engine_recovery_timeout_s)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if not request_ids or self.is_dead:
            return
        for request_id in request_ids:
            self._parked.pop(request_id, None)
        for index, ids in self._owners(request_ids).items():
            try:
                await self.input_socket.send_multipart(
                    self._frames(self.engines[index].identity, RequestType.ABORT, ids), copy=False
                )
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise  # NOTE: unreachable, the engine is gone, and so are these requests there

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        """Calls every serving engine; the first engine's answer (all must answer)."""
        results = await self.call_utility_all_async(method, *args)
        return results[0]

    async def call_utility_all_async(self, method: str, *args: Any) -> list[Any]:
        engines = self.alive_engines
        if not engines:
            raise EngineDeadError("no engine is serving")
        futures = []
        for engine in engines:
            call_id, frames = self._utility_frames(engine, method, args)
            future: asyncio.Future[Any] = self._loop.create_future()
            self._utility_calls[call_id] = future
            self._utility_owner[call_id] = engine.index
            await self.input_socket.send_multipart(frames, copy=False)
            futures.append(future)
        return list(await asyncio.gather(*futures))

    def shutdown(self) -> None:
        # NOTE: a request that reaches a client shut down (its model just unloaded) gets "engine is dead", not a socket error.
        self._is_dead = True
        for task in self._tasks:
            task.cancel()
        self._close()
