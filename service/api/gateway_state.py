"""What an app's routes read of their gateway, in one typed place: the gateway's parts (`GatewayState`,
`app.state.gateway`, read by `gateway_of`) and each served model's (`ServerState`, read by `server_state`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from starlette.requests import Request

from service.api.admission import Admission
from service.config import GatewayConfig
from service.frontend.async_llm import AsyncLLM
from service.models.model_pool import ModelPool, ModelSlot
from service.observability.dashboard import RecentRequests
from service.openai.background_responses import BackgroundResponses
from service.openai.prepare import Preparer

if TYPE_CHECKING:
    from service.openai.batch_worker import BatchWorker
    from service.openai.response_store import ResponseStore
    from service.streams.stream_store import StreamStore

DEFAULT_MAX_REQUEST_BODY_BYTES: int = GatewayConfig.max_request_body_bytes  # the setting's default, declared there
# NOTE: where a multi-model gateway's routing (service/api/model_routing.py) puts the state of the model a request names.
STATE_KEY = "zeroserve.server"


class ServerState:
    """Shared by the routes of one gateway process."""

    def __init__(
        self,
        llm: AsyncLLM,
        preparer: Preparer,
        gateway: GatewayState,
        max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
        metrics_registry: CollectorRegistry | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        recent_requests: RecentRequests | None = None,
    ) -> None:
        self.llm = llm
        self.preparer = preparer
        self.max_request_body_bytes = max_request_body_bytes
        self.metrics_registry = metrics_registry
        self.gateway = gateway  # NOTE: the parts every model's routes share (admission, kept streams and responses)
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        # NOTE: the last finished requests, for the dashboard (None: it lists none).
        self.recent_requests = recent_requests

    @property
    def admission(self) -> Admission:
        return self.gateway.admission

    @property
    def served_model_names(self) -> list[str]:
        return self.preparer.served_model_names

    @property
    def engine_status(self) -> str:
        """"ok" while an engine serves, else why none does: "dead", "recovering" (a lost engine
        restarts) or "waiting_for_engine" (every engine left cleanly; remote ones may join)."""
        if self.llm.is_dead:
            return "dead"
        if self.llm.engine_client.is_recovering:
            return "recovering"
        if not self.llm.engine_client.live_engine_indices:
            return "waiting_for_engine"
        return "ok"


def server_state(request: Request) -> ServerState:
    """The state of the model the request names (a multi-model gateway's routing put it there), else the one model's."""
    state: ServerState | None = request.scope.get(STATE_KEY)
    return state if state is not None else gateway_of(request.app).one_model()


# NOTE: a multi-model gateway's pool and its slots, each loaded model's state the routes' own.
ServerPool = ModelPool[ServerState]
ServerSlot = ModelSlot[ServerState]


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
    background: BackgroundResponses = field(default_factory=BackgroundResponses)  # this process's unfinished ones

    def one_model(self) -> ServerState:
        """The one model's state (a route runs only once admission lets it, after the engine is ready)."""
        assert self.server is not None, "a one-model route ran before its engine was ready"
        return self.server


def gateway_of(app: Any) -> GatewayState:
    """The gateway state of a Starlette app made by `create_app`."""
    state: GatewayState = app.state.gateway
    return state
