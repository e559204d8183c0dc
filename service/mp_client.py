"""MPClient: what the sync and asyncio multiprocess clients share (sockets, engine process,
handshake, utility results)."""

from __future__ import annotations

import itertools
import logging
import shutil
import tempfile
from typing import Any

import zmq

from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_input import RequestType, UtilityCall
from proto.engine_output import ENGINE_CORE_DEAD, EngineCoreOutputs, UtilityResult
from proto.handshake import PROTOCOL_VERSION, EngineReady
from proto.sockets import make_zmq_socket, new_ipc_address
from service.core_client import EngineCoreClient, EngineDeadError
from service.engine_launcher import EngineArgs, EngineProcess

logger = logging.getLogger(__name__)


class MPClient(EngineCoreClient):
    """ROUTER (bound) sends requests to engine processes; PULL (bound) receives their outputs."""

    def __init__(self, engine_args: EngineArgs, ctx: zmq.Context[Any]) -> None:
        self.engine_args = engine_args
        self.ctx = ctx
        self.socket_dir = tempfile.mkdtemp(prefix="zeroserve-")
        self.input_address = new_ipc_address(self.socket_dir)
        self.output_address = new_ipc_address(self.socket_dir)
        self.input_socket = make_zmq_socket(ctx, self.input_address, zmq.ROUTER, bind=True, linger=0)
        self.output_socket = make_zmq_socket(ctx, self.output_address, zmq.PULL, bind=True, linger=0)
        self.encoder = MsgpackEncoder()
        self.outputs_decoder: MsgpackDecoder[EngineCoreOutputs] = MsgpackDecoder(EngineCoreOutputs)
        self.engine_identity = b""
        self._is_dead = False
        self._call_ids = itertools.count()
        self.engine = EngineProcess(
            engine_args, 0, self.input_address, self.output_address, self._on_engine_exit
        )

    @property
    def is_dead(self) -> bool:
        return self._is_dead

    def _accept_ready(self, frames: list[Any]) -> EngineReady:
        """Checks an engine's ready message (its first DEALER message) and remembers it."""
        identity, *payload = frames
        ready: EngineReady = MsgpackDecoder(EngineReady).decode(payload)
        if ready.protocol_version != PROTOCOL_VERSION:
            raise EngineDeadError(
                f"engine speaks protocol {ready.protocol_version}, gateway {PROTOCOL_VERSION}"
            )
        self.engine_identity, self.ready = identity, ready
        return ready

    def _decode_outputs(self, frames: list[Any]) -> EngineCoreOutputs | None:
        """The outputs in `frames` (received with copy=False), or None when the engine says its core died."""
        if len(frames) == 1 and frames[0].bytes == ENGINE_CORE_DEAD:
            return None
        return self.outputs_decoder.decode(frames)

    def _frames(self, request_type: RequestType, message: Any) -> list[Any]:
        if self._is_dead:
            raise EngineDeadError("engine is dead")
        return [self.engine_identity, request_type.value, *self.encoder.encode(message)]

    def _utility_frames(self, method: str, args: tuple[Any, ...]) -> tuple[int, list[Any]]:
        call_id = next(self._call_ids)
        return call_id, self._frames(RequestType.UTILITY, UtilityCall(call_id, method, list(args)))

    def _on_engine_exit(self, returncode: int) -> None:
        """Runs in the watcher thread when the engine process ends unexpectedly."""
        logger.error("engine process exited with code %d", returncode)
        self._engine_died(f"engine process exited with code {returncode}")

    def _engine_died(self, reason: str) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        self.engine.shutdown()
        self.input_socket.close(0)
        self.output_socket.close(0)
        self.ctx.term()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def utility_outcome(result: UtilityResult) -> tuple[Any, BaseException | None]:
    """A utility result as (value, error)."""
    if result.error is not None:
        return None, RuntimeError(result.error)
    return result.result, None
