"""The gateway's link to engines on other hosts: TCP addresses and ZeroMQ CURVE (encryption and
authentication of both ends), with key files made by `zeroserve keys generate`."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from proto import envs
from proto.engine_link import remote_addresses
from proto.settings import check_settings, positive, setting

logger = logging.getLogger(__name__)


def _check_engine_address(engine_address: str | None) -> None:
    if engine_address is not None:
        remote_addresses(engine_address)


@dataclass(frozen=True)
class LinkSettings:
    """Where engines on other hosts join, what they must prove, and how lost engines are replaced
    (`zeroserve serve`'s scale-out flags)."""

    engine_address: str | None = setting(
        None, "where engines on other hosts join (`zeroserve engine --gateway` it): requests on PORT, "
        "outputs on PORT+1 (default: none; local engines use private ipc:// sockets)",
        check=_check_engine_address, group="scale-out", metavar="tcp://HOST:PORT",
    )
    curve_secret_key: str | None = setting(
        None, "the gateway's CURVE secret key (`zeroserve keys generate`): links to engines are "
        "encrypted and both ends authenticated (default: off)", group="scale-out", metavar="FILE",
    )
    curve_authorized_keys: str | None = setting(
        None, "folder of the public keys (*.key) of engines allowed to join (with --curve-secret-key)",
        group="scale-out", metavar="DIR",
    )
    heartbeat_timeout_s: float = setting(
        5.0, "an engine silent this long is taken out of rotation, its requests resumed on another",
        flag="--heartbeat-timeout", check=positive, group="scale-out", metavar="SECONDS",
    )
    is_engine_restart: bool = setting(
        True, "start a new engine process when a local one dies; its requests continue there "
        "(--no-engine-restart: a lost engine stays lost)", flag="--engine-restart", group="scale-out",
    )
    engine_recovery_timeout_s: float = setting(
        120.0, "how long requests of a lost engine wait for a serving engine before they end with an error",
        flag="--engine-recovery-timeout", check=positive, group="scale-out", metavar="SECONDS",
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if (self.curve_secret_key is None) != (self.curve_authorized_keys is None):
            raise ValueError("--curve-secret-key and --curve-authorized-keys go together")

    @property
    def is_curve(self) -> bool:
        return self.curve_secret_key is not None


def generate_keys(directory: Path, name: str) -> tuple[Path, Path]:
    """A CURVE key pair: `name.key` (public, to share) and `name.key_secret` (keep it private)."""
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(str(directory), name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


class CurveServer:
    """With CURVE on: the gateway's socket options, a ZAP authenticator that admits only
    authorised engine keys (and logs each key it refuses, once), and an ephemeral key pair for
    the gateway's own engines."""

    def __init__(self, ctx: zmq.Context[Any], link: LinkSettings) -> None:
        self.socket_options: dict[int, Any] = {}
        self.local_engine_env: dict[str, str] = {}
        self._authenticator: ThreadAuthenticator | None = None
        if not link.is_curve:
            return
        assert link.curve_secret_key is not None and link.curve_authorized_keys is not None
        public, secret = zmq.auth.load_certificate(link.curve_secret_key)
        if secret is None:
            raise ValueError(f"{link.curve_secret_key} holds no secret key")
        self.socket_options = {zmq.CURVE_SERVER: 1, zmq.CURVE_PUBLICKEY: public, zmq.CURVE_SECRETKEY: secret}
        local_public, local_secret = zmq.curve_keypair()
        # NOTE: the folder's keys as they are at start, and the gateway's own engines' key.
        keys = AuthorisedKeys(link.curve_authorized_keys, {local_public})
        self.local_engine_env = envs.local_engine_curve_env(
            public.decode(), local_public.decode(), local_secret.decode()
        )
        # NOTE: a sync view of the same libzmq context, so the ZAP handler serves its sockets.
        self._authenticator = ThreadAuthenticator(zmq.Context.shadow(ctx.underlying))
        self._authenticator.start()
        self._authenticator.configure_curve_callback(domain="*", credentials_provider=keys)

    def stop(self) -> None:
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None


class AuthorisedKeys:
    """The ZAP handler's answer for a CURVE public key: in the authorised folder, or refused
    (logged once per key: an engine retries its handshake every reconnect)."""

    def __init__(self, folder: str, extra_keys: set[bytes]) -> None:
        self.folder = folder
        self.keys = set(zmq.auth.load_certificates(folder)) | extra_keys
        self._refused: set[bytes] = set()

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.keys:
            return True
        if key not in self._refused:
            self._refused.add(key)
            logger.warning(
                "refused an engine: its CURVE public key %s is not among the authorised keys in %s",
                key.decode(), self.folder,
            )
        return False
