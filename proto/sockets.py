"""ZeroMQ socket construction and addresses (`ipc://` and `tcp://`)."""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

import zmq


def new_ipc_address(directory: str | None = None) -> str:
    """A fresh `ipc://` address in a private directory."""
    directory = directory or tempfile.mkdtemp(prefix="zeroserve-")
    os.chmod(directory, 0o700)
    return f"ipc://{directory}/{uuid.uuid4().hex[:12]}"


def make_zmq_socket(
    ctx: zmq.Context[Any],
    address: str,
    socket_type: int,
    *,
    bind: bool,
    identity: bytes | None = None,
    linger: int | None = None,
    options: dict[int, Any] | None = None,
) -> zmq.Socket[Any]:
    """Makes a socket with no message limits and binds or connects it to `address`; `options`
    (e.g. CURVE keys) are set before either."""
    if not address.startswith(("ipc://", "tcp://", "inproc://")):
        raise ValueError(f"unsupported ZeroMQ address {address!r}: use ipc://, tcp:// or inproc://")
    sock: zmq.Socket[Any] = ctx.socket(socket_type)
    # NOTE: no high-water marks: backpressure is the scheduler's job, not the socket's.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity)
    if linger is not None:
        sock.setsockopt(zmq.LINGER, linger)
    if socket_type == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    for option, value in (options or {}).items():
        sock.setsockopt(option, value)
    if bind:
        sock.bind(address)
    else:
        sock.connect(address)
    return sock


def engine_identity(engine_index: int) -> bytes:
    """The ROUTER identity of engine `engine_index`."""
    return engine_index.to_bytes(2, "little")
