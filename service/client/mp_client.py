"""MPClient: what the sync and asyncio multiprocess clients share — sockets, engine processes,
handshakes, routing each request to the least-loaded engine, and knowing which engine owns what."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, RequestType, UtilityCall
from proto.engine_link import remote_addresses
from proto.engine_output import ENGINE_CORE_DEAD, EngineCoreOutputs, UtilityResult
from proto.handshake import ANY_ENGINE_INDEX, PROTOCOL_VERSION, EngineAccept, EngineMessageType, EngineReady
from proto.sockets import make_zmq_socket, new_ipc_address
from service.client.core_client import EngineCoreClient, EngineDeadError
from service.client.curve import CurveServer, LinkSettings
from service.client.engine_launcher import EngineProcess
from service.client.engine_state import DeathNotice, EngineLost, EngineState

logger = logging.getLogger(__name__)


class MPClient(EngineCoreClient):
    """ROUTER (bound) sends requests to engine processes; PULL (bound) receives their outputs."""

    def __init__(
        self,
        engine_config: EngineConfig,
        ctx: zmq.Context[Any],
        data_parallel_size: int = 1,
        link: LinkSettings | None = None,
        engine_addresses: tuple[str, str] | None = None,
        log_format: str = "text",
    ) -> None:
        """`engine_addresses` (input, output): engines someone else started connect there (a
        gateway process of several sharing engines); without them this client starts its own,
        which log in `log_format`."""
        self.link = link or LinkSettings()
        if data_parallel_size < 0 or (data_parallel_size == 0 and self.link.engine_address is None):
            raise ValueError("--data-parallel-size must be >= 1, or 0 with --engine-address for remote engines only")
        self.engine_config = engine_config
        self.data_parallel_size = data_parallel_size
        self.ctx = ctx
        self.socket_dir = tempfile.mkdtemp(prefix="zeroserve-")
        self.input_address, self.output_address = engine_addresses or (
            new_ipc_address(self.socket_dir), new_ipc_address(self.socket_dir)
        )
        self.curve = CurveServer(ctx, self.link)
        options = self.curve.socket_options
        # NOTE: handover: a restarted engine takes over its predecessor's identity at once.
        self.input_socket = make_zmq_socket(
            ctx, self.input_address, zmq.ROUTER, bind=True, linger=0, options={**options, zmq.ROUTER_HANDOVER: 1}
        )
        self.output_socket = make_zmq_socket(ctx, self.output_address, zmq.PULL, bind=True, linger=0, options=options)
        if self.link.engine_address is not None:
            input_tcp, output_tcp = remote_addresses(self.link.engine_address)
            self.input_socket.bind(input_tcp)
            self.output_socket.bind(output_tcp)
            logger.info("engines on other hosts join at %s (outputs to %s)", input_tcp, output_tcp)
        self.encoder = MsgpackEncoder()
        self.ready_decoder: MsgpackDecoder[EngineReady] = MsgpackDecoder(EngineReady)
        self.outputs_decoder: MsgpackDecoder[EngineCoreOutputs] = MsgpackDecoder(EngineCoreOutputs)
        self.suspects_decoder: MsgpackDecoder[list[str]] = MsgpackDecoder(list[str])
        self.engines: dict[int, EngineState] = {}
        self.request_owner: dict[str, EngineState] = {}
        self._is_dead = False
        self._call_ids = itertools.count()
        self.log_format = log_format
        self.processes = [self._start_engine(index) for index in range(0 if engine_addresses else data_parallel_size)]

    def _start_engine(self, engine_index: int) -> EngineProcess:
        env = {**self.curve.local_engine_env, "ZEROSERVE_ENGINE_ERROR_FILE": self._error_file(engine_index)}
        return EngineProcess(
            self.engine_config, engine_index, self.input_address, self.output_address, self._on_engine_exit, env,
            self.log_format,
        )

    def _error_file(self, engine_index: int) -> str:
        return os.path.join(self.socket_dir, f"engine-{engine_index}.error")

    def start_error(self) -> str | None:
        """Why a local engine could not load its model, as it wrote it before exiting, or None."""
        for index in range(self.data_parallel_size):
            with contextlib.suppress(OSError):
                return Path(self._error_file(index)).read_text()
        return None

    @property
    def is_dead(self) -> bool:
        """True once no engine is left serving and one was lost (after the first joined); engines
        that all left cleanly leave the gateway waiting for another (`live_engine_indices` empty)."""
        if self._is_dead:
            return True
        return bool(self.engines) and not self.alive_engines and not all(e.has_left for e in self.engines.values())

    @property
    def live_engine_indices(self) -> list[int]:
        return [engine.index for engine in self.alive_engines]

    def is_serving_rank(self, rank: int) -> bool:
        engine = self.engines.get(rank)
        return engine is not None and engine.is_routable

    @property
    def alive_engines(self) -> list[EngineState]:
        return [engine for engine in self.engines.values() if engine.is_alive]

    @property
    def memory_bytes(self) -> int:
        """The memory the serving engines hold at most, as their latest heartbeats report it."""
        return sum(engine.ready.memory_bytes for engine in self.alive_engines)

    # Handshake.
    def _handle_engine_message(self, frames: list[Any]) -> list[Any] | None:
        """An engine's READY (a registration or a heartbeat), DRAINING or GOODBYE; returns the
        frames to send back, if any. A malformed message is logged and dropped."""
        try:
            return self._engine_message_reply(frames)
        except Exception as error:  # noqa: BLE001 (whatever a peer sent, the gateway serves on)
            _log_dropped("engines'", error)
            return None

    def _engine_message_reply(self, frames: list[Any]) -> list[Any] | None:
        identity, type_frame, *payload = frames
        engine = self._engine_by_identity(identity)
        message_type = EngineMessageType(type_frame)
        if message_type is EngineMessageType.READY:
            ready = self.ready_decoder.decode(payload)
            if engine is not None and engine.is_alive:
                if ready.instance_id == engine.ready.instance_id:
                    engine.last_seen = time.monotonic()
                    engine.ready.memory_bytes = ready.memory_bytes
                    return None
                # NOTE: its process was replaced (a restart elsewhere) before its silence was noticed.
                self._replaced(engine.index)
            accept = self._register(identity, ready)
            return [identity, RequestType.HANDSHAKE.value, *self.encoder.encode(accept)]
        if engine is None:
            return None
        if message_type is EngineMessageType.DRAINING:
            logger.info("engine %d is draining: no new requests go to it", engine.index)
            engine.is_draining = True
        elif message_type is EngineMessageType.GOODBYE:
            self._goodbye(engine)
        return None

    def _register(self, identity: bytes, ready: EngineReady) -> EngineAccept:
        """Checks a new engine against the gateway and the engines already serving."""
        error = self._refusal(ready)
        if error is not None:
            logger.error("refused engine %s from %s: %s", ready.engine_index, ready.host or "?", error)
            return EngineAccept(ANY_ENGINE_INDEX, error)
        index = ready.engine_index
        known = self.engines.get(index)
        if index == ANY_ENGINE_INDEX or (known is not None and known.identity != identity):
            index = max([self.data_parallel_size - 1, *self.engines]) + 1
        ready.engine_index = index
        self.engines[index] = EngineState(ready, identity)
        self.ready = self.engines[min(self.engines)].ready
        logger.info(
            "engine %d joined from %s: %s, %d KV tokens", index, ready.host or "?", ready.model_name,
            ready.num_kv_tokens,
        )
        return EngineAccept(index)

    def _refusal(self, ready: EngineReady) -> str | None:
        if ready.protocol_version != PROTOCOL_VERSION:
            return f"it speaks protocol {ready.protocol_version}, the gateway {PROTOCOL_VERSION}"
        expected = self.engine_config.model_name
        if expected and ready.model_name != expected:
            return f"it serves {ready.model_name!r}, the gateway {expected!r}"
        serving = [e.ready for e in self.engines.values() if e.is_alive]
        if serving:
            first = serving[0]
            if (ready.vocab_size, ready.max_model_len) != (first.vocab_size, first.max_model_len):
                return (
                    f"its vocabulary/context ({ready.vocab_size}, {ready.max_model_len}) differ from "
                    f"the serving engines' ({first.vocab_size}, {first.max_model_len})"
                )
        if ready.runner != "pooling" and ready.num_kv_tokens < ready.max_model_len:  # NOTE: an encoder keeps no cache
            return f"its KV cache holds {ready.num_kv_tokens} tokens, less than one {ready.max_model_len}-token context"
        return None

    def _engine_by_identity(self, identity: bytes) -> EngineState | None:
        """The engine registered from `identity`: the serving registration where it has one (a process
        lost for a silence, then back, is registered again under a new index: its heartbeats keep
        that one alive), else its latest."""
        registrations = [engine for engine in self.engines.values() if engine.identity == identity]
        serving = [engine for engine in registrations if engine.is_alive]
        latest = serving or registrations
        return latest[-1] if latest else None

    def _goodbye(self, engine: EngineState) -> None:
        if engine.request_ids:
            self._engine_died(engine.index, "it left with requests in flight")
        else:
            engine.is_alive = False
            engine.has_left = True
            remaining = len(self.alive_engines)
            logger.info("engine %d left (%s)", engine.index, f"{remaining} serving" if remaining else "waiting for an engine")

    def _silent_engines(self) -> list[EngineState]:
        """Engines whose heartbeat stopped."""
        deadline = time.monotonic() - self.link.heartbeat_timeout_s
        return [e for e in self.engines.values() if e.is_alive and e.last_seen < deadline]

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

    def _lose_engine(
        self, engine_index: int, reason: str, suspect_request_ids: list[str] | None = None
    ) -> EngineLost | None:
        """Takes an engine out of rotation; returns the news of it with the requests it had."""
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
        return EngineLost(
            engine_index, request_ids, f"engine {engine_index} lost: {reason}", suspect_request_ids=suspect_request_ids
        )

    # Frames.
    def _decode_outputs(self, frames: list[Any]) -> EngineCoreOutputs | DeathNotice | None:
        """The outputs in `frames` (received with copy=False), an engine's report that its core
        died, or None for anything else (logged and dropped)."""
        try:
            if frames[0].bytes == ENGINE_CORE_DEAD:
                index = int.from_bytes(frames[1].bytes, "little") if len(frames) > 1 else 0
                if index not in self.engines:
                    raise ValueError(f"a fatal error reported for engine {index}, which is not serving")
                suspects = self.suspects_decoder.decode(frames[2:]) if len(frames) > 2 else []
                return DeathNotice(index, suspects)
            return self.outputs_decoder.decode(frames)
        except Exception as error:  # noqa: BLE001 (whatever a peer sent, the gateway serves on)
            _log_dropped("outputs", error)
            return None

    def _frames(self, identity: bytes, request_type: RequestType, message: Any) -> list[Any]:
        if self._is_dead:
            raise EngineDeadError("engine is dead")
        return [identity, request_type.value, *self.encoder.encode(message)]

    def _utility_frames(self, engine: EngineState, method: str, args: tuple[Any, ...]) -> tuple[int, list[Any]]:
        call_id = next(self._call_ids)
        return call_id, self._frames(engine.identity, RequestType.UTILITY, UtilityCall(call_id, method, list(args)))

    def _on_engine_exit(self, process: EngineProcess, returncode: int) -> None:
        """Runs in a watcher thread when an engine process ends unexpectedly."""
        logger.error("engine process %d exited with code %d", process.engine_index, returncode)
        self._engine_died(process.engine_index, f"engine process exited with code {returncode}")

    def _engine_died(self, engine_index: int, reason: str) -> None:
        raise NotImplementedError

    def _replaced(self, engine_index: int) -> None:
        """Engine `engine_index`'s process is gone, a new one in its place: its requests move on."""
        self._engine_died(engine_index, "a new engine process took its place")

    def _close(self) -> None:
        for process in self.processes:
            process.shutdown()
        self.curve.stop()
        self.input_socket.close(0)
        self.output_socket.close(0)
        self.ctx.term()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def utility_outcome(result: UtilityResult) -> tuple[Any, BaseException | None]:
    """A utility result as (value, error)."""
    if result.error is not None:
        return None, RuntimeError(result.error)
    return result.result, None


def _log_dropped(socket_name: str, error: Exception) -> None:
    logger.warning("dropping a malformed message on the %s socket: %s: %s", socket_name, type(error).__name__, error)
