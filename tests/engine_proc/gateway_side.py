"""The gateway's side of the engine's sockets, bound in a test: what the engine-process tests talk to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import zmq

from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_input import RequestType
from proto.engine_output import EngineCoreOutputs
from proto.handshake import EngineAccept, EngineMessageType, EngineReady
from proto.sockets import engine_identity, make_zmq_socket, new_ipc_address


class Gateway:
    """The gateway's side of the wire: ROUTER and PULL, bound."""

    def __init__(self, directory: Path, engine_index: int = 3) -> None:
        self.identity = engine_identity(engine_index)
        self.ctx = zmq.Context()
        self.input_address = new_ipc_address(str(directory))
        self.output_address = new_ipc_address(str(directory))
        self.router = make_zmq_socket(self.ctx, self.input_address, zmq.ROUTER, bind=True, linger=0)
        self.pull = make_zmq_socket(self.ctx, self.output_address, zmq.PULL, bind=True, linger=0)
        self.encoder = MsgpackEncoder()
        self.decoder = MsgpackDecoder(EngineCoreOutputs)

    def send(self, request_type: RequestType, message: Any) -> None:
        self.router.send_multipart([self.identity, request_type.value, *self.encoder.encode(message)])

    def recv(self) -> list[zmq.Frame]:
        assert self.pull.poll(5000), "no output from the engine"
        return self.pull.recv_multipart(copy=False)

    def recv_outputs(self) -> EngineCoreOutputs:
        return self.decoder.decode(self.recv())

    def close(self) -> None:
        self.router.close()
        self.pull.close()
        self.ctx.term()


def recv_ready(gateway: Gateway) -> EngineReady:
    """The engine's ready message; the gateway accepts it."""
    assert gateway.router.poll(5000)
    identity, message_type, *frames = gateway.router.recv_multipart()
    assert identity == gateway.identity and message_type == EngineMessageType.READY.value
    ready: EngineReady = MsgpackDecoder(EngineReady).decode(frames)
    gateway.send(RequestType.HANDSHAKE, EngineAccept(ready.engine_index))
    return ready
