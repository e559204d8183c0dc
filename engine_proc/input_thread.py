"""Input socket IO thread: gateway messages → decoded → the busy loop's input queue."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

import zmq

from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_input import EngineCoreRequest, RequestType, UtilityCall
from proto.handshake import EngineReady
from proto.sockets import engine_identity, make_zmq_socket

logger = logging.getLogger(__name__)

InputItem = tuple[RequestType, Any]

_POLL_MS = 100


class InputThread(threading.Thread):
    """DEALER (identity = engine index) connected to the gateway's ROUTER, read with a Poller."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        address: str,
        ready: EngineReady,
        input_queue: queue.Queue[InputItem],
    ) -> None:
        super().__init__(name="engine-input", daemon=True)
        self.ctx = ctx
        self.address = address
        self.ready = ready
        self.input_queue = input_queue
        self.stop_event = threading.Event()
        self.decoders: dict[RequestType, MsgpackDecoder[Any]] = {
            RequestType.ADD: MsgpackDecoder(EngineCoreRequest),
            RequestType.ABORT: MsgpackDecoder(list[str]),
            RequestType.UTILITY: MsgpackDecoder(UtilityCall),
        }

    def run(self) -> None:
        identity = engine_identity(self.ready.engine_index)
        sock = make_zmq_socket(
            self.ctx, self.address, zmq.DEALER, bind=False, identity=identity, linger=0
        )
        try:
            # The first message registers our identity with the ROUTER and says we are ready.
            sock.send_multipart(MsgpackEncoder().encode(self.ready))
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            while not self.stop_event.is_set():
                for ready_sock, _ in poller.poll(_POLL_MS):
                    type_frame, *frames = ready_sock.recv_multipart(copy=False)
                    self._handle(bytes(type_frame.buffer), frames)
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
