"""How an engine reaches its gateway: a headless engine's behaviour, CURVE keys, and the wait
for the gateway's acceptance."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth

# NOTE: how a gateway hands its local engines an ephemeral CURVE identity (not argv: `ps` shows
# it); service/curve.py sets them.
ENV_CURVE_PUBLIC = "ZEROSERVE_ENGINE_CURVE_PUBLIC"
ENV_CURVE_SECRET = "ZEROSERVE_ENGINE_CURVE_SECRET"
ENV_GATEWAY_PUBLIC = "ZEROSERVE_GATEWAY_CURVE_PUBLIC"


@dataclass(frozen=True)
class LinkConfig:
    """A headless engine joins a gateway it did not start, and drains on SIGTERM."""

    is_headless: bool = False
    curve_secret_key: str | None = None
    gateway_public_key: str | None = None
    accept_timeout_s: float | None = None

    def __post_init__(self) -> None:
        if (self.curve_secret_key is None) != (self.gateway_public_key is None):
            raise ValueError("--curve-secret-key and --gateway-public-key go together")


def add_link_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("link to the gateway")
    group.add_argument(
        "--headless", action="store_true",
        help="join a gateway this process was not started by: ask it for an index, drain on SIGTERM",
    )
    group.add_argument("--curve-secret-key", default=None, help="this engine's CURVE secret key file")
    group.add_argument("--gateway-public-key", default=None, help="the gateway's CURVE public key file")
    group.add_argument(
        "--accept-timeout", type=float, default=None,
        help="exit with an error if the gateway has not accepted this engine after so many seconds",
    )


def parse_link_args(argv: list[str] | None) -> LinkConfig:
    parser = argparse.ArgumentParser(add_help=False)
    add_link_args(parser)
    args, _ = parser.parse_known_args(argv)
    return LinkConfig(args.headless, args.curve_secret_key, args.gateway_public_key, args.accept_timeout)


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
