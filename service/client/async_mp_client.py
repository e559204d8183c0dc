"""AsyncMPClient: the gateway's ZeroMQ link to its engine processes, on asyncio."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq
import zmq.asyncio

from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, RequestType
from proto.engine_output import EngineCoreOutputs
from proto.handshake import EngineReady
from service.client.core_client import EngineDeadError
from service.client.curve import LinkSettings
from service.client.engine_state import EngineLost
from service.client.mp_client import MPClient, utility_outcome

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
        super().__init__(engine_config, zmq.asyncio.Context(), data_parallel_size, link, engine_addresses, log_format)

    async def wait_ready(self, timeout: float = 300.0) -> EngineReady:
        """Waits for every local engine's ready message (or, with none, the first remote one)."""
        dead = asyncio.ensure_future(self._dead.wait())
        try:
            while len(self.alive_engines) < max(self.data_parallel_size, 1):
                recv = asyncio.ensure_future(self.input_socket.recv_multipart())
                done, _ = await asyncio.wait({recv, dead}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if recv not in done:
                    recv.cancel()
                    raise EngineDeadError("the engine process did not start; see its log above")
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

    async def _process_input_socket(self) -> None:
        """Engines joining, beating, draining and leaving while the gateway runs."""
        while True:
            await self._answer(await self.input_socket.recv_multipart())

    async def _monitor_heartbeats(self) -> None:
        interval = min(0.5, self.link.heartbeat_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            for engine in self._silent_engines():
                self._lose(engine.index, f"no heartbeat for {self.link.heartbeat_timeout_s:g} s")

    def _engine_died(self, engine_index: int, reason: str) -> None:
        # NOTE: called from the watcher threads as well as from the loop.
        self._loop.call_soon_threadsafe(self._lose, engine_index, reason)

    def _lose(self, engine_index: int, reason: str) -> None:
        if self._is_dead:
            return
        if engine_index not in self.engines:  # NOTE: died before it was ready.
            self._mark_dead(reason)
            return
        lost = self._lose_engine(engine_index, reason)
        if lost is None:
            return
        error = EngineDeadError(lost.reason)
        for call_id, owner in list(self._utility_owner.items()):
            future = self._utility_calls.pop(call_id, None)
            if owner == engine_index and future is not None and not future.done():
                future.set_exception(error)
        if not self.alive_engines and self.link.engine_address is None and self.processes:
            self._mark_dead(reason)
        else:
            # NOTE: with remote engines, others may still join: the gateway lives on.
            self.outputs_queue.put_nowait(lost)

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
            if isinstance(outputs, int):
                self._lose(outputs, "the engine core reported a fatal error")
                continue
            if outputs.utility_output is None:
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

    async def get_output_async(self) -> EngineCoreOutputs | EngineLost:
        item = await self.outputs_queue.get()
        if isinstance(item, BaseException):
            self.outputs_queue.put_nowait(item)  # NOTE: every later caller sees it too.
            raise item
        return item

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        engine = self._route(request)
        try:
            await self.input_socket.send_multipart(self._frames(engine.identity, RequestType.ADD, request), copy=False)
        except BaseException:
            self._owners([request.request_id])
            raise

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if not request_ids or self.is_dead:
            return
        for index, ids in self._owners(request_ids).items():
            await self.input_socket.send_multipart(
                self._frames(self.engines[index].identity, RequestType.ABORT, ids), copy=False
            )

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
        for task in self._tasks:
            task.cancel()
        self._close()
