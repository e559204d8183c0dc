"""Output socket IO thread: the busy loop's outputs → encoded → PUSH to the gateway that asked."""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from typing import Any

import zmq

from proto.codec import MsgpackEncoder
from proto.engine_output import ENGINE_CORE_DEAD, EngineCoreOutputs
from proto.sockets import make_zmq_socket

logger = logging.getLogger(__name__)

# NOTE: how long a closing socket keeps trying to deliver ENGINE_CORE_DEAD and the last outputs.
_LINGER_MS = 4000


class Shutdown:
    """Queue sentinel: flush and stop; `is_dead` also tells the gateway the engine died, and which
    requests were being added or stepped when it did."""

    def __init__(self, is_dead: bool, suspect_request_ids: list[str] | None = None) -> None:
        self.is_dead = is_dead
        self.suspect_request_ids = suspect_request_ids or []


# NOTE: (client index, outputs): each gateway (client) has its own PULL socket.
OutputItem = tuple[int, EngineCoreOutputs] | Shutdown


class OutputThread(threading.Thread):
    """One PUSH per gateway, connected to its PULL; zero-copy, tracked sends with reused buffers."""

    def __init__(
        self,
        ctx: zmq.Context[Any],
        addresses: list[str],
        output_queue: queue.Queue[OutputItem],
        engine_index: int = 0,
        socket_options: dict[int, Any] | None = None,
    ) -> None:
        super().__init__(name="engine-output", daemon=True)
        self.engine_index = engine_index
        self.socket_options = socket_options
        self.ctx = ctx
        self.addresses = addresses
        self.output_queue = output_queue
        self.free_buffers: list[bytearray] = []

    def run(self) -> None:
        sockets = [
            make_zmq_socket(self.ctx, address, zmq.PUSH, bind=False, linger=_LINGER_MS, options=self.socket_options)
            for address in self.addresses
        ]
        encoder = MsgpackEncoder()
        # (tracker, outputs, buffer): outputs are kept alive until zmq is done with their memory.
        pending: deque[tuple[zmq.MessageTracker, EngineCoreOutputs, bytearray]] = deque()
        try:
            while True:
                item = self.output_queue.get()
                if isinstance(item, Shutdown):
                    if item.is_dead:
                        notice = [
                            ENGINE_CORE_DEAD, (self.engine_index & 0xFFFF).to_bytes(2, "little"),
                            *encoder.encode(item.suspect_request_ids),
                        ]
                        for sock in sockets:
                            sock.send_multipart(notice)
                    return
                client_index, outputs = item
                self._reclaim(pending)
                buffer = self.free_buffers.pop() if self.free_buffers else bytearray()
                frames = encoder.encode_into(outputs, buffer)
                tracker = sockets[client_index].send_multipart(frames, copy=False, track=True)
                if tracker.done:
                    self.free_buffers.append(buffer)
                else:
                    pending.appendleft((tracker, outputs, buffer))
        finally:
            for sock in sockets:
                sock.close()

    def _reclaim(self, pending: deque[tuple[zmq.MessageTracker, EngineCoreOutputs, bytearray]]) -> None:
        while pending and pending[-1][0].done:
            self.free_buffers.append(pending.pop()[2])
