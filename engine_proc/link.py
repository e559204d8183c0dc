"""The engine's side of its link to a gateway: CURVE options for its sockets."""

from __future__ import annotations

from typing import Any

import zmq
import zmq.auth

from proto import envs
from proto.engine_link import LinkConfig


def socket_options(link: LinkConfig) -> dict[int, Any]:
    """CURVE client options from key files, or from the gateway's environment for its local engines."""
    if link.curve_secret_key is not None and link.gateway_public_key is not None:
        public, secret = zmq.auth.load_certificate(link.curve_secret_key)
        server_public, _ = zmq.auth.load_certificate(link.gateway_public_key)
        if secret is None:
            raise ValueError(f"{link.curve_secret_key} holds no secret key")
        return {zmq.CURVE_SERVERKEY: server_public, zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret}
    keys = envs.local_engine_curve_keys()
    if keys is not None:
        gateway_public, engine_public, engine_secret = keys
        return {
            zmq.CURVE_SERVERKEY: gateway_public.encode(),
            zmq.CURVE_PUBLICKEY: engine_public.encode(),
            zmq.CURVE_SECRETKEY: engine_secret.encode(),
        }
    return {}
