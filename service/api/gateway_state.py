"""What an app's routes read of their gateway, in one typed place (`app.state.gateway`, read by `gateway_of`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from service.config import GatewayConfig

if TYPE_CHECKING:
    from service.api.admission import Admission
    from service.api.server_state import ServerPool, ServerState
    from service.api.stream_store import StreamStore
    from service.openai.batch_worker import BatchWorker
    from service.openai.response_store import ResponseStore


@dataclass
class GatewayState:
    """The gateway's parts its routes read: made by `create_app`, filled in by `attach`, `attach_pool` and `Gateway`."""

    admission: Admission
    streams: StreamStore  # kept streams (--stream-retention)
    sse_keepalive_s: float = GatewayConfig.sse_keepalive_s
    server: ServerState | None = None  # the one model's, once its engine is ready
    pool: ServerPool | None = None  # a multi-model gateway's models
    batches: BatchWorker | None = None  # the Batch API's files and batches (None: --responses-store off)
    response_store: ResponseStore | None = None  # kept Responses (None: --responses-store off)
    max_upload_bytes: int = GatewayConfig.max_upload_bytes
    background_responses: dict[str, asyncio.Task[None]] = field(default_factory=dict)  # unfinished, by id

    def one_model(self) -> ServerState:
        """The one model's state (a route runs only once admission lets it, after the engine is ready)."""
        assert self.server is not None, "a one-model route ran before its engine was ready"
        return self.server


def gateway_of(app: Any) -> GatewayState:
    """The gateway state of a Starlette app made by `create_app`."""
    state: GatewayState = app.state.gateway
    return state
