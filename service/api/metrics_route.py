"""GET /metrics: the gateway's Prometheus metrics, in the classic text format."""

from __future__ import annotations

from prometheus_client import generate_latest
from starlette.requests import Request
from starlette.responses import Response

from service.api.server_state import ServerState
from service.openai.errors import APIError

# NOTE: always the classic format, whatever the Accept header: every Prometheus reads it, and
# prometheus_client's OpenMetrics output turns the `:` of our names into `_` for scrapers that
# do not ask for UTF-8 names (Prometheus 2's default), which would break the dashboards.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if state.metrics_registry is None:
        raise APIError("Metrics are not enabled on this server.", 404, error_type="not_found_error")
    return Response(generate_latest(state.metrics_registry), headers={"Content-Type": CONTENT_TYPE})
