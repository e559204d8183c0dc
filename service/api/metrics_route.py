"""GET /metrics: the gateway's Prometheus metrics, in the format the scraper asks for."""

from __future__ import annotations

from prometheus_client.exposition import choose_encoder
from starlette.requests import Request
from starlette.responses import Response

from service.api.errors import APIError
from service.api.server_state import ServerState


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if state.metrics_registry is None:
        raise APIError("Metrics are not enabled on this server.", 404, error_type="not_found_error")
    # NOTE: the classic text format unless the Accept header asks for OpenMetrics.
    encode, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encode(state.metrics_registry), headers={"Content-Type": content_type})
