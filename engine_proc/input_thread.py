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
    """DEALER connected to the gateway's ROUTER, read with a Poller; identity = the engine's index,
    or random bytes for an engine that asks the gateway for an index."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        address: str,
        ready: EngineReady,
        input_queue: queue.Queue[InputItem],
        socket_options: dict[int, Any] | None = None,
    ) -> None:
        super().__init__(name="engine-input", daemon=True)
        self.ctx = ctx
        self.address = address
        self.ready = ready
        self.input_queue = input_queue
        self.socket_options = socket_options or {}
        self.identity = engine_identity(ready.engine_index) if ready.engine_index >= 0 else os.urandom(16)
        self.stop_event = threading.Event()
        self.drain_event = threading.Event()
        self.goodbye_event = threading.Event()
        self.decoders: dict[RequestType, MsgpackDecoder[Any]] = {
            RequestType.ADD: MsgpackDecoder(EngineCoreRequest),
            RequestType.ABORT: MsgpackDecoder(list[str]),
            RequestType.UTILITY: MsgpackDecoder(UtilityCall),
            RequestType.HANDSHAKE: MsgpackDecoder(EngineAccept),
        }

    def run(self) -> None:
        sock = make_zmq_socket(
            self.ctx, self.address, zmq.DEALER, bind=False, identity=self.identity, linger=0,
            options=self.socket_options,
        )
        encoder = MsgpackEncoder()
        ready_frames = [EngineMessageType.READY.value, *encoder.encode(self.ready)]
        try:
            # The first message registers our identity with the ROUTER and says we are ready;
            # repeated, it is our heartbeat.
            sock.send_multipart(ready_frames)
            last_beat, has_sent_drain = time.monotonic(), False
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            while not self.stop_event.is_set():
                for ready_sock, _ in poller.poll(_POLL_MS):
                    type_frame, *frames = ready_sock.recv_multipart(copy=False)
                    self._handle(bytes(type_frame.buffer), frames)
                if time.monotonic() - last_beat >= HEARTBEAT_INTERVAL_S:
                    sock.send_multipart(ready_frames)
                    last_beat = time.monotonic()
                if self.drain_event.is_set() and not has_sent_drain:
                    sock.send(EngineMessageType.DRAINING.value)
                    has_sent_drain = True
                if self.goodbye_event.is_set():
                    sock.send(EngineMessageType.GOODBYE.value)
                    sock.setsockopt(zmq.LINGER, _GOODBYE_LINGER_MS)
                    return
        finally:
            sock.close()

    def _handle(self, type_byte: bytes, frames: list[Any]) -> None:
        try:
            request_type = RequestType(type_byte)
            message = self.decoders[request_type].decode(frames)
        except Exception:  # noqa: BLE001 - one bad message must not stop the engine
            logger.exception("dropping undecodable message of type %r", type_byte)
            return
        self.input_queue.put_nowait((request_type, message))
