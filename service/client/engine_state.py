"""The gateway's view of one engine: who it is, whether it is up, and the requests it owns."""

from __future__ import annotations

import time
from typing import NamedTuple

from proto.handshake import EngineReady

# NOTE: as vLLM's DP balancer: a waiting request weighs more than a running one.
_WAITING_WEIGHT = 4


class EngineState:
    """One engine's identity and load, kept up to date from what is sent to and received from it."""

    def __init__(self, ready: EngineReady, identity: bytes) -> None:
        self.index = ready.engine_index
        self.identity = identity
        self.ready = ready
        self.is_alive = True
        self.has_left = False  # NOTE: said goodbye with nothing in flight (not lost)
        self.is_draining = False
        self.last_seen = time.monotonic()
        # request id → prompt tokens, for requests with no output yet
        self.waiting: dict[str, int] = {}
        self.running: set[str] = set()

    @property
    def is_routable(self) -> bool:
        return self.is_alive and not self.is_draining

    @property
    def load(self) -> tuple[int, int]:
        """(weighted requests in flight, prompt tokens waiting): lower is less loaded."""
        return _WAITING_WEIGHT * len(self.waiting) + len(self.running), sum(self.waiting.values())

    @property
    def request_ids(self) -> list[str]:
        return [*self.waiting, *self.running]

    def add(self, request_id: str, num_prompt_tokens: int) -> None:
        self.waiting[request_id] = num_prompt_tokens

    def started(self, request_id: str) -> None:
        if self.waiting.pop(request_id, None) is not None:
            self.running.add(request_id)

    def remove(self, request_id: str) -> None:
        self.waiting.pop(request_id, None)
        self.running.discard(request_id)


class EngineLost:
    """An outputs-queue item: an engine went away. Its requests are resumed elsewhere (or on its
    restart) unless `can_resume` is False; `suspect_request_ids` were being added or stepped when
    it reported a fatal error."""

    def __init__(
        self, engine_index: int, request_ids: list[str], reason: str, can_resume: bool = True,
        suspect_request_ids: list[str] | None = None,
    ) -> None:
        self.engine_index = engine_index
        self.request_ids = request_ids
        self.reason = reason
        self.can_resume = can_resume
        self.suspect_request_ids = suspect_request_ids or []


class DeathNotice(NamedTuple):
    """An engine's own report that its core failed, and the requests it was busy with."""

    engine_index: int
    suspect_request_ids: list[str]
