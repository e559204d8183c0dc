"""MPClient: what the sync and asyncio multiprocess clients share — sockets, engine processes,
handshakes, routing each request to the least-loaded engine, and knowing which engine owns what."""

from __future__ import annotations

import functools
import itertools
import logging
import shutil
import tempfile
from typing import Any

import zmq

from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_input import EngineCoreRequest, RequestType, UtilityCall
from proto.engine_output import ENGINE_CORE_DEAD, EngineCoreOutputs, UtilityResult
from proto.handshake import PROTOCOL_VERSION, EngineReady
from proto.sockets import make_zmq_socket, new_ipc_address
from service.core_client import EngineCoreClient, EngineDeadError
from service.engine_launcher import EngineArgs, EngineProcess
from service.engine_state import EngineLost, EngineState

logger = logging.getLogger(__name__)


class MPClient(EngineCoreClient):
    """ROUTER (bound) sends requests to engine processes; PULL (bound) receives their outputs."""

    def __init__(self, engine_args: EngineArgs, ctx: zmq.Context[Any], data_parallel_size: int = 1) -> None:
        if data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
        self.engine_args = engine_args
        self.data_parallel_size = data_parallel_size
        self.ctx = ctx
        self.socket_dir = tempfile.mkdtemp(prefix="zeroserve-")
        self.input_address = new_ipc_address(self.socket_dir)
        self.output_address = new_ipc_address(self.socket_dir)
        self.input_socket = make_zmq_socket(ctx, self.input_address, zmq.ROUTER, bind=True, linger=0)
        self.output_socket = make_zmq_socket(ctx, self.output_address, zmq.PULL, bind=True, linger=0)
        self.encoder = MsgpackEncoder()
        self.outputs_decoder: MsgpackDecoder[EngineCoreOutputs] = MsgpackDecoder(EngineCoreOutputs)
        self.engines: dict[int, EngineState] = {}
        self.request_owner: dict[str, EngineState] = {}
        self._is_dead = False
        self._call_ids = itertools.count()
        self.processes = [
            EngineProcess(
                engine_args, index, self.input_address, self.output_address,
                functools.partial(self._on_engine_exit, index),
            )
            for index in range(data_parallel_size)
        ]

    @property
    def is_dead(self) -> bool:
        return self._is_dead

    @property
    def alive_engines(self) -> list[EngineState]:
        return [engine for engine in self.engines.values() if engine.is_alive]

    # Handshake.
    def _accept_ready(self, frames: list[Any]) -> EngineReady:
        """Checks an engine's ready message (its first DEALER message) and registers the engine."""
        identity, *payload = frames
        ready: EngineReady = MsgpackDecoder(EngineReady).decode(payload)
        if ready.protocol_version != PROTOCOL_VERSION:
            raise EngineDeadError(
                f"engine speaks protocol {ready.protocol_version}, gateway {PROTOCOL_VERSION}"
            )
        if self.engines:
            first = next(iter(self.engines.values())).ready
            if (ready.model_name, ready.vocab_size, ready.max_model_len) != (
                first.model_name, first.vocab_size, first.max_model_len
            ):
                raise EngineDeadError(f"engine {ready.engine_index} serves another model than engine {first.engine_index}")
        self.engines[ready.engine_index] = EngineState(ready, identity)
        self.ready = self.engines[min(self.engines)].ready
        return ready

    # Routing.
    def _route(self, request: EngineCoreRequest) -> EngineState:
        """The engine for a new request: the one it names, else the least loaded."""
        rank = request.data_parallel_rank
        if rank is not None:
            engine = self.engines.get(rank)
            if engine is None or not engine.is_routable:
                raise ValueError(f"data_parallel_rank {rank} is not a serving engine (serving: {self._ranks()})")
        else:
            candidates = [e for e in self.engines.values() if e.is_routable]
            if not candidates:
                raise EngineDeadError("no engine is serving")
            engine = min(candidates, key=lambda e: e.load)
        engine.add(request.request_id, len(request.prompt_token_ids))
        self.request_owner[request.request_id] = engine
        return engine

    def _ranks(self) -> str:
        return ", ".join(str(e.index) for e in self.engines.values() if e.is_routable) or "none"

    def _track(self, outputs: EngineCoreOutputs) -> None:
        """Updates each engine's load from its outputs."""
        for output in outputs.outputs:
            engine = self.request_owner.get(output.request_id)
            if engine is None:
                continue
            if output.is_finished:
                engine.remove(output.request_id)
                del self.request_owner[output.request_id]
            else:
                engine.started(output.request_id)

    def _owners(self, request_ids: list[str]) -> dict[int, list[str]]:
        """Forgets the requests; returns them grouped by the engine that has them."""
        by_engine: dict[int, list[str]] = {}
        for request_id in request_ids:
            engine = self.request_owner.pop(request_id, None)
            if engine is not None and engine.is_alive:
                engine.remove(request_id)
                by_engine.setdefault(engine.index, []).append(request_id)
        return by_engine

    def _lose_engine(self, engine_index: int, reason: str) -> EngineLost | None:
        """Takes an engine out of rotation; its requests end with an error naming it."""
        engine = self.engines.get(engine_index)
        if engine is None or not engine.is_alive:
            return None
        engine.is_alive = False
        request_ids = engine.request_ids
        for request_id in request_ids:
            self.request_owner.pop(request_id, None)
        engine.waiting.clear()
        engine.running.clear()
        logger.error("engine %d lost: %s", engine_index, reason)
        return EngineLost(engine_index, request_ids, f"engine {engine_index} lost: {reason}")

    # Frames.
    def _decode_outputs(self, frames: list[Any]) -> EngineCoreOutputs | int:
        """The outputs in `frames` (received with copy=False), or the index of an engine whose
        core died."""
        if frames[0].bytes == ENGINE_CORE_DEAD:
            return int.from_bytes(frames[1].bytes, "little") if len(frames) > 1 else 0
        return self.outputs_decoder.decode(frames)

    def _frames(self, identity: bytes, request_type: RequestType, message: Any) -> list[Any]:
        if self._is_dead:
            raise EngineDeadError("engine is dead")
        return [identity, request_type.value, *self.encoder.encode(message)]

    def _utility_frames(self, engine: EngineState, method: str, args: tuple[Any, ...]) -> tuple[int, list[Any]]:
        call_id = next(self._call_ids)
        return call_id, self._frames(engine.identity, RequestType.UTILITY, UtilityCall(call_id, method, list(args)))

    def _on_engine_exit(self, engine_index: int, returncode: int) -> None:
        """Runs in a watcher thread when an engine process ends unexpectedly."""
        logger.error("engine process %d exited with code %d", engine_index, returncode)
        self._engine_died(engine_index, f"engine process exited with code {returncode}")

    def _engine_died(self, engine_index: int, reason: str) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        for process in self.processes:
            process.shutdown()
        self.input_socket.close(0)
        self.output_socket.close(0)
        self.ctx.term()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def utility_outcome(result: UtilityResult) -> tuple[Any, BaseException | None]:
    """A utility result as (value, error)."""
    if result.error is not None:
        return None, RuntimeError(result.error)
    return result.result, None
