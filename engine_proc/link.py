"""The engine's side of its link to a gateway: CURVE options for its sockets."""

from __future__ import annotations

import os
from typing import Any

import zmq
import zmq.auth

from proto.engine_link import ENV_CURVE_PUBLIC, ENV_CURVE_SECRET, ENV_GATEWAY_PUBLIC, LinkConfig


def socket_options(link: LinkConfig) -> dict[int, Any]:
    """CURVE client options from key files, or from the gateway's environment for its local engines."""
    if link.curve_secret_key is not None and link.gateway_public_key is not None:
        public, secret = zmq.auth.load_certificate(link.curve_secret_key)
        server_public, _ = zmq.auth.load_certificate(link.gateway_public_key)
        if secret is None:
            raise ValueError(f"{link.curve_secret_key} holds no secret key")
        return {zmq.CURVE_SERVERKEY: server_public, zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret}
    if ENV_CURVE_SECRET in os.environ:
        return {
            zmq.CURVE_SERVERKEY: os.environ[ENV_GATEWAY_PUBLIC].encode(),
            zmq.CURVE_PUBLICKEY: os.environ[ENV_CURVE_PUBLIC].encode(),
            zmq.CURVE_SECRETKEY: os.environ[ENV_CURVE_SECRET].encode(),
        }
    return {}
