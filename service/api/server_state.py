"""What every route shares: the engine client, the preparer of request bodies, admission."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from starlette.requests import Request

from service.api.admission import Admission
from service.api.gateway_state import gateway_of
from service.config import GatewayConfig
from service.frontend.async_llm import AsyncLLM
from service.models.model_pool import ModelPool, ModelSlot
from service.observability.dashboard import RecentRequests
from service.openai.prepare import Preparer

DEFAULT_MAX_REQUEST_BODY_BYTES: int = GatewayConfig.max_request_body_bytes  # the setting's default, declared there
# NOTE: where a multi-model gateway's routing (service/api/model_routing.py) puts the state of the model a request names.
STATE_KEY = "zeroserve.server"


class ServerState:
    """Shared by the routes of one gateway process."""

    def __init__(
        self,
        llm: AsyncLLM,
        preparer: Preparer,
        max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
        metrics_registry: CollectorRegistry | None = None,
        admission: Admission | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        recent_requests: RecentRequests | None = None,
    ) -> None:
        self.llm = llm
        self.preparer = preparer
        self.max_request_body_bytes = max_request_body_bytes
        self.metrics_registry = metrics_registry
        self.admission = admission or Admission()
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        # NOTE: the last finished requests, for the dashboard (None: it lists none).
        self.recent_requests = recent_requests

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
