"""GET / (the playground) and GET /dashboard: static pages served by the gateway, the settings
the playground starts from, and the dashboard's live figures over SSE."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from service.api.admission import Admission, Phase
from service.api.server_state import ServerState
from service.frontend.sampling_params import generation_defaults_of
from service.observability.dashboard import DashboardFeed
from service.openai.errors import APIError

STATIC_DIR = Path(__file__).parent / "static"
DASHBOARD_INTERVAL_S = 1.0

# NOTE: the pages may load and ask nothing but this origin: no inline script, no other host.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


async def playground(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "playground.html", headers=_PAGE_HEADERS)


async def dashboard(request: Request) -> Response:
    return FileResponse(STATIC_DIR / "dashboard.html", headers=_PAGE_HEADERS)


async def playground_settings(request: Request) -> Response:
    """The served models and the sampling values a request gets when it names none."""
    state: ServerState = request.app.state.server
    # NOTE: what a request that names none of these gets: the model's generation config (and
    # --override-generation-config) for the first four, OpenAI's defaults for the penalties.
    return JSONResponse({
        "models": state.served_model_names,
        "max_model_len": state.llm.ready.max_model_len,
        "defaults": {
            **generation_defaults_of(state.preparer.generation_defaults),
            "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
        },
        "is_stream_kept": request.app.state.streams.is_enabled,
    })


async def dashboard_events(request: Request) -> Response:
    """The dashboard's frames, one about every second, as SSE `data:` events."""
    state: ServerState = request.app.state.server
    if state.metrics_registry is None:
        raise APIError("Metrics are not enabled on this server, so there is no dashboard.", 404,
                       error_type="not_found_error")
    feed = DashboardFeed(state.metrics_registry, state.recent_requests)
    return EventSourceResponse(_frames(feed, state, request.app.state.admission), sep="\n")


async def _frames(feed: DashboardFeed, state: ServerState, admission: Admission) -> AsyncIterator[dict[str, str]]:
    # NOTE: the first frame at once (no rates yet), then one per interval; a drain ends the stream.
    while admission.phase is Phase.SERVING:
        frame = {**feed.frame(), "engine_status": state.engine_status}
        yield {"data": json.dumps(frame, separators=(",", ":"))}
        await asyncio.sleep(DASHBOARD_INTERVAL_S)


def web_routes() -> list[BaseRoute]:
    return [
        Route("/", playground, methods=["GET"]),
        Route("/dashboard", dashboard, methods=["GET"]),
        Route("/playground/settings", playground_settings, methods=["GET"]),
        Route("/dashboard/events", dashboard_events, methods=["GET"]),
        Mount("/static", StaticFiles(directory=STATIC_DIR), name="static"),
    ]
