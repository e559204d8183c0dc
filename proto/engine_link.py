"""How an engine process reaches its gateway, declared once for both sides: the link flags of
`python -m engine_proc` (which `zeroserve engine` also takes), the TCP addresses of an
`--engine-address`, and a local engine's death with its gateway. (The environment that hands a
gateway's local engines their CURVE identity is declared with every other in proto/envs.py.)"""

from __future__ import annotations

import argparse
import ctypes
import signal
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class LinkConfig:
    """A headless engine joins a gateway it did not start, and drains on SIGTERM."""

    is_headless: bool = False
    curve_secret_key: str | None = None  # this engine's CURVE secret key file
    gateway_public_key: str | None = None  # the gateway's CURVE public key file
    # NOTE: a gateway accepts an engine as soon as its ready message arrives; an engine that
    # waited this long after loading is talking to the wrong address, or to no gateway.
    accept_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if (self.curve_secret_key is None) != (self.gateway_public_key is None):
            raise ValueError("--curve-secret-key and --gateway-public-key go together")
        if not self.accept_timeout_s > 0:
            raise ValueError(f"--accept-timeout must be > 0, got {self.accept_timeout_s}")

    def to_argv(self) -> list[str]:
        argv = ["--headless"] if self.is_headless else []
        if self.curve_secret_key is not None and self.gateway_public_key is not None:
            argv += ["--curve-secret-key", self.curve_secret_key, "--gateway-public-key", self.gateway_public_key]
        return [*argv, "--accept-timeout", str(self.accept_timeout_s)]


def add_link_args(parser: argparse.ArgumentParser, *, has_headless_flag: bool = True) -> None:
    group = parser.add_argument_group("link to the gateway")
    if has_headless_flag:
        group.add_argument(
            "--headless", action="store_true",
            help="join a gateway this process was not started by: ask it for an index, drain on SIGTERM",
        )
    group.add_argument("--curve-secret-key", default=None, help="this engine's CURVE secret key file (key_secret)")
    group.add_argument("--gateway-public-key", default=None, help="the gateway's CURVE public key file (.key)")
    group.add_argument(
        "--accept-timeout", type=float, default=LinkConfig.accept_timeout_s, metavar="SECONDS",
        help="exit with an error if the gateway has not accepted this engine after so many seconds "
        "(default: %(default)s)",
    )


def link_config_from(args: argparse.Namespace, is_headless: bool | None = None) -> LinkConfig:
    """The parsed link flags (`is_headless` where the command has no --headless flag)."""
    headless = args.headless if is_headless is None else is_headless
    return LinkConfig(headless, args.curve_secret_key, args.gateway_public_key, args.accept_timeout)


def remote_addresses(engine_address: str) -> tuple[str, str]:
    """The request and output addresses of `tcp://HOST:PORT` (outputs on PORT + 1)."""
    host, _, port = engine_address.removeprefix("tcp://").rpartition(":")
    if not engine_address.startswith("tcp://") or not host or not port.isdigit() or not 0 < int(port) < 65535:
        raise ValueError(f"engine address must be tcp://HOST:PORT, got {engine_address!r}")
    return f"tcp://{host}:{port}", f"tcp://{host}:{int(port) + 1}"


def die_with_parent() -> None:
    """Linux: the kernel sends SIGKILL to this process when its parent dies (a gateway's local
    engines and its gateway processes call it; `--headless` engines outlive a gateway)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
