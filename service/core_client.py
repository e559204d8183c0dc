"""AsyncMPClient: the gateway's ZeroMQ link to its engine processes (asyncio side)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import shutil
import tempfile
from typing import Any, cast

import zmq
import zmq.asyncio

from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_input import EngineCoreRequest, RequestType, UtilityCall
from proto.engine_output import ENGINE_CORE_DEAD, EngineCoreOutputs
from proto.handshake import PROTOCOL_VERSION, EngineReady
from proto.sockets import make_zmq_socket, new_ipc_address
from service.engine_launcher import EngineArgs, EngineProcess

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine process is gone; requests in flight cannot finish."""


class AsyncMPClient:
    """ROUTER (bound) sends requests to engines; PULL (bound) receives their outputs."""

    def __init__(self, engine_args: EngineArgs) -> None:
        self.engine_args = engine_args
        self.ctx = zmq.asyncio.Context()
        self.socket_dir = tempfile.mkdtemp(prefix="zeroserve-")
        self.input_address = new_ipc_address(self.socket_dir)
        self.output_address = new_ipc_address(self.socket_dir)
        self.input_socket: zmq.asyncio.Socket = cast(
            zmq.asyncio.Socket,
            make_zmq_socket(self.ctx, self.input_address, zmq.ROUTER, bind=True, linger=0),
        )
        self.output_socket: zmq.asyncio.Socket = cast(
            zmq.asyncio.Socket,
            make_zmq_socket(self.ctx, self.output_address, zmq.PULL, bind=True, linger=0),
        )
        self.encoder = MsgpackEncoder()
        self.outputs_decoder: MsgpackDecoder[EngineCoreOutputs] = MsgpackDecoder(EngineCoreOutputs)
        self.outputs_queue: asyncio.Queue[EngineCoreOutputs | BaseException] = asyncio.Queue()
        self.ready: EngineReady | None = None
        self.engine_identity = b""
        self.is_dead = False
        self._dead = asyncio.Event()
        self._utility_calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._loop = asyncio.get_running_loop()
        self._tasks: list[asyncio.Task[None]] = []
        self.engine = EngineProcess(
            engine_args, 0, self.input_address, self.output_address, self._on_engine_exit
        )

    async def wait_ready(self, timeout: float = 300.0) -> EngineReady:
        """Waits for the engine's ready message (its first DEALER message)."""
        recv = asyncio.ensure_future(self.input_socket.recv_multipart())
        dead = asyncio.ensure_future(self._dead.wait())
        done, _ = await asyncio.wait({recv, dead}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        dead.cancel()
        if recv not in done:
            recv.cancel()
            raise EngineDeadError("the engine process did not start; see its log above")
        identity, *frames = recv.result()
        ready: EngineReady = MsgpackDecoder(EngineReady).decode(frames)
        if ready.protocol_version != PROTOCOL_VERSION:
            raise EngineDeadError(
                f"engine speaks protocol {ready.protocol_version}, gateway {PROTOCOL_VERSION}"
            )
        self.engine_identity, self.ready = identity, ready
        self._tasks.append(asyncio.create_task(self._process_outputs_socket(), name="outputs-socket"))
        return ready

    def _on_engine_exit(self, returncode: int) -> None:
        """Runs in the watcher thread when the engine process ends unexpectedly."""
        logger.error("engine process exited with code %d", returncode)
        self._loop.call_soon_threadsafe(self._mark_dead, f"engine process exited with code {returncode}")

    def _mark_dead(self, reason: str) -> None:
        if self.is_dead:
            return
        self.is_dead = True
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
            if len(frames) == 1 and frames[0].bytes == ENGINE_CORE_DEAD:
                self._mark_dead("the engine core reported a fatal error")
                return
            outputs = self.outputs_decoder.decode(frames)
            if outputs.utility_output is not None:
                result = outputs.utility_output
                future = self._utility_calls.pop(result.call_id, None)
                if future is not None and not future.done():
                    if result.error is not None:
                        future.set_exception(RuntimeError(result.error))
                    else:
                        future.set_result(result.result)
                continue
            self.outputs_queue.put_nowait(outputs)

    async def get_output_async(self) -> EngineCoreOutputs:
        item = await self.outputs_queue.get()
        if isinstance(item, BaseException):
            self.outputs_queue.put_nowait(item)  # NOTE: every later caller sees it too.
            raise item
        return item

    async def _send(self, request_type: RequestType, message: Any) -> None:
        if self.is_dead:
            raise EngineDeadError("engine is dead")
        frames = self.encoder.encode(message)
        await self.input_socket.send_multipart([self.engine_identity, request_type.value, *frames], copy=False)

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        await self._send(RequestType.ADD, request)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        if request_ids and not self.is_dead:
            await self._send(RequestType.ABORT, request_ids)

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._utility_calls[call_id] = future
        await self._send(RequestType.UTILITY, UtilityCall(call_id, method, list(args)))
        return await future

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.engine.shutdown()
        self.input_socket.close(0)
        self.output_socket.close(0)
        self.ctx.term()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
