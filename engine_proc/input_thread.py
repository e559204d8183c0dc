"""Input socket IO thread: gateway messages → decoded → the busy loop's input queue; and the
engine's side of the handshake: ready (repeated as a heartbeat), draining, goodbye."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

import zmq

from engine_proc.memory_report import committed_memory_bytes
from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_input import EngineCoreRequest, RequestType, UtilityCall
from proto.handshake import EngineAccept, EngineMessageType, EngineReady
from proto.sockets import engine_identity, make_zmq_socket

logger = logging.getLogger(__name__)

InputItem = tuple[RequestType, Any]

_POLL_MS = 100
_GOODBYE_LINGER_MS = 1000
HEARTBEAT_INTERVAL_S = 1.0


class InputThread(threading.Thread):
    """One DEALER per gateway, connected to its ROUTER, all read with one Poller; identity = the
    engine's index, or random bytes for an engine that asks the gateway for an index."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        addresses: list[str],
        ready: EngineReady,
        input_queue: queue.Queue[InputItem],
        socket_options: dict[int, Any] | None = None,
    ) -> None:
        super().__init__(name="engine-input", daemon=True)
        self.ctx = ctx
        self.addresses = addresses
        self.ready = ready
        self.input_queue = input_queue
        self.socket_options = socket_options or {}
        self.identity = engine_identity(ready.engine_index) if ready.engine_index >= 0 else os.urandom(16)
        self.stop_event = threading.Event()
        self.drain_event = threading.Event()
        self.goodbye_event = threading.Event()
        self.encoder = MsgpackEncoder()
        self.decoders: dict[RequestType, MsgpackDecoder[Any]] = {
            RequestType.ADD: MsgpackDecoder(EngineCoreRequest),
            RequestType.ABORT: MsgpackDecoder(list[str]),
            RequestType.UTILITY: MsgpackDecoder(UtilityCall),
            RequestType.HANDSHAKE: MsgpackDecoder(EngineAccept),
        }

    def run(self) -> None:
        sockets = [
            make_zmq_socket(
                self.ctx, address, zmq.DEALER, bind=False, identity=self.identity, linger=0,
                options=self.socket_options,
            )
            for address in self.addresses
        ]
        client_of = {sock: client_index for client_index, sock in enumerate(sockets)}
        try:
            # The first message registers our identity with each ROUTER and says we are ready;
            # repeated, it is our heartbeat.
            self._send_all(sockets, self._ready_frames())
            last_beat, has_sent_drain = time.monotonic(), False
            poller = zmq.Poller()
            for sock in sockets:
                poller.register(sock, zmq.POLLIN)
            while not self.stop_event.is_set():
                for ready_sock, _ in poller.poll(_POLL_MS):
                    type_frame, *frames = ready_sock.recv_multipart(copy=False)
                    self._handle(bytes(type_frame.buffer), frames, client_of[ready_sock])
                if time.monotonic() - last_beat >= HEARTBEAT_INTERVAL_S:
                    self._send_all(sockets, self._ready_frames())
                    last_beat = time.monotonic()
                if self.drain_event.is_set() and not has_sent_drain:
                    self._send_all(sockets, [EngineMessageType.DRAINING.value])
                    has_sent_drain = True
                if self.goodbye_event.is_set():
                    self._send_all(sockets, [EngineMessageType.GOODBYE.value])
                    for sock in sockets:
                        sock.setsockopt(zmq.LINGER, _GOODBYE_LINGER_MS)
                    return
        except zmq.ContextTerminated:
            return  # NOTE: the engine is exiting (refused, or never accepted): it has said why.
        finally:
            for sock in sockets:
                sock.close()

    def _ready_frames(self) -> list[Any]:
        """The ready message with the engine's memory measured now, so each heartbeat carries it."""
        self.ready.memory_bytes = committed_memory_bytes(self.ready)
        return [EngineMessageType.READY.value, *self.encoder.encode(self.ready)]

    @staticmethod
    def _send_all(sockets: list[zmq.Socket[Any]], frames: list[bytes]) -> None:
        """Sends to each gateway now, or not at all: with no connection up (a handshake refused,
        a gateway restarting) a heartbeat is skipped, the next one tries again."""
        for sock in sockets:
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK)
            except zmq.Again:
                pass

    def _handle(self, type_byte: bytes, frames: list[Any], client_index: int) -> None:
        try:
            request_type = RequestType(type_byte)
            message = self.decoders[request_type].decode(frames)
        except Exception:
            logger.exception("dropping undecodable message of type %r", type_byte)
            return
        if request_type in (RequestType.ADD, RequestType.UTILITY):
            message.client_index = client_index
        elif request_type is RequestType.HANDSHAKE:
            message = (client_index, message)
        self.input_queue.put_nowait((request_type, message))
