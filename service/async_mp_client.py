"""AsyncMPClient: the gateway's ZeroMQ link to its engine processes, on asyncio."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq
import zmq.asyncio

from proto.engine_input import EngineCoreRequest, RequestType
from proto.engine_output import EngineCoreOutputs
from proto.handshake import EngineReady
from service.core_client import EngineDeadError
from service.engine_launcher import EngineArgs
from service.mp_client import MPClient, utility_outcome


class AsyncMPClient(MPClient):
    """One task moves decoded outputs from the PULL socket to `outputs_queue`."""

    input_socket: zmq.asyncio.Socket
    output_socket: zmq.asyncio.Socket

    def __init__(self, engine_args: EngineArgs) -> None:
        self.outputs_queue: asyncio.Queue[EngineCoreOutputs | BaseException] = asyncio.Queue()
        self._dead = asyncio.Event()
        self._utility_calls: dict[int, asyncio.Future[Any]] = {}
        self._loop = asyncio.get_running_loop()
        self._tasks: list[asyncio.Task[None]] = []
        super().__init__(engine_args, zmq.asyncio.Context())

    async def wait_ready(self, timeout: float = 300.0) -> EngineReady:
        """Waits for the engine's ready message (its first DEALER message)."""
        recv = asyncio.ensure_future(self.input_socket.recv_multipart())
        dead = asyncio.ensure_future(self._dead.wait())
        done, _ = await asyncio.wait({recv, dead}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        dead.cancel()
        if recv not in done:
            recv.cancel()
            raise EngineDeadError("the engine process did not start; see its log above")
        ready = self._accept_ready(recv.result())
        self._tasks.append(asyncio.create_task(self._process_outputs_socket(), name="outputs-socket"))
        return ready

    def _engine_died(self, reason: str) -> None:
        # NOTE: called from the watcher thread as well as from the loop.
        self._loop.call_soon_threadsafe(self._mark_dead, reason)

    def _mark_dead(self, reason: str) -> None:
        if self._is_dead:
            return
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
                self._mark_dead("the engine core reported a fatal error")
                return
            if outputs.utility_output is None:
                self.outputs_queue.put_nowait(outputs)
                continue
            future = self._utility_calls.pop(outputs.utility_output.call_id, None)
            if future is not None and not future.done():
                value, error = utility_outcome(outputs.utility_output)
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(value)

    async def get_output_async(self) -> EngineCoreOutputs:
        item = await self.outputs_queue.get()
        if isinstance(item, BaseException):
            self.outputs_queue.put_nowait(item)  # NOTE: every later caller sees it too.
            raise item
        return item

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        await self.input_socket.send_multipart(self._frames(RequestType.ADD, request), copy=False)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if request_ids and not self.is_dead:
            await self.input_socket.send_multipart(self._frames(RequestType.ABORT, request_ids), copy=False)

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        call_id, frames = self._utility_frames(method, args)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._utility_calls[call_id] = future
        await self.input_socket.send_multipart(frames, copy=False)
        return await future

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._close()
