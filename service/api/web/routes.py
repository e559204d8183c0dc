"""GET / (the playground) and GET /dashboard: static pages served by the gateway, the settings
the playground starts from, and the dashboard's live figures over SSE (of one model of several,
where the server has several)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry
from sse_starlette import EventSourceResponse
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from service.api.admission import Admission, Phase
from service.api.gateway_state import ServerPool, ServerSlot, ServerState, gateway_of
from service.frontend.sampling_params import generation_defaults_of
from service.models.model_pool import ModelStatus
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
    """The served models and the sampling values a request gets when it names none (on a multi-model
    server, those of the model `?model=` names, else of the first, and each model's status)."""
    gateway = gateway_of(request.app)
    pool = gateway.pool
    if pool is not None:
        body = _pool_settings(pool, request.query_params.get("model"))
    else:
        state = gateway.one_model()
        body = {
            "models": state.served_model_names, "max_model_len": state.llm.ready.max_model_len,
            "defaults": _sampling_defaults(state.preparer.generation_defaults),
        }
    return JSONResponse({**body, "is_stream_kept": gateway.streams.is_enabled})


def _pool_settings(pool: ServerPool, name: str | None) -> dict[str, object]:
    """A multi-model server's settings: a loaded model's from its engine, an unloaded one's from its entry."""
    slot = pool.slot_of(name)
    max_model_len: int | None
    if slot.state is not None:
        max_model_len = slot.state.llm.ready.max_model_len
        generation_defaults = slot.state.preparer.generation_defaults
    else:
        # NOTE: as the model's state will combine them once loaded (its file's, then its own settings');
        # its length is known before then only where it is set.
        max_model_len = slot.entry.config.engine.max_model_len
        generation_defaults = {**slot.entry.generation_defaults, **dict(slot.entry.config.generation_config)}
    slots = pool.slots.values()
    return {
        "models": [served for other in slots for served in other.entry.names],
        "model": slot.id,
        "max_model_len": max_model_len,
        "defaults": _sampling_defaults(generation_defaults),
        "statuses": {served: other.status.value for other in slots for served in other.entry.names},
    }


def _sampling_defaults(generation_defaults: Mapping[str, float]) -> dict[str, object]:
    # NOTE: what a request that names none of these gets: the model's generation config (and
    # --override-generation-config) for the first four, OpenAI's defaults for the penalties.
    return {
        **generation_defaults_of(generation_defaults),
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
    }


async def dashboard_events(request: Request) -> Response:
    """The dashboard's frames, one about every second, as SSE `data:` events (on a multi-model server,
    of the model `?model=` names, else of the first loaded)."""
    gateway = gateway_of(request.app)
    admission, pool = gateway.admission, gateway.pool
    if pool is not None:
        return EventSourceResponse(_pool_frames(_dashboard_slot(pool, request), admission), sep="\n")
    state = gateway.one_model()
    if state.metrics_registry is None:
        raise APIError("Metrics are not enabled on this server, so there is no dashboard.", 404,
                       error_type="not_found_error")
    feed = DashboardFeed(state.metrics_registry, state.recent_requests)
    return EventSourceResponse(_frames(feed, state, admission), sep="\n")


async def _frames(feed: DashboardFeed, state: ServerState, admission: Admission) -> AsyncIterator[dict[str, str]]:
    # NOTE: the first frame at once (no rates yet), then one per interval; a drain ends the stream.
    while admission.phase is Phase.SERVING:
        frame = {**feed.frame(), "engine_status": state.engine_status}
        yield {"data": json.dumps(frame, separators=(",", ":"))}
        await asyncio.sleep(DASHBOARD_INTERVAL_S)


def _dashboard_slot(pool: ServerPool, request: Request) -> ServerSlot:
    name = request.query_params.get("model")
    if name:
        return pool.slot_of(name)
    return next((slot for slot in pool.slots.values() if slot.state is not None), pool.default_slot)


async def _pool_frames(slot: ServerSlot, admission: Admission) -> AsyncIterator[dict[str, str]]:
    """One model's frames: while it is not loaded, its status and no figures; once loaded, its engines'
    (a feed of each state it gets: a reload starts from zero, as its registry does)."""
    # NOTE: an empty registry's frame is the page's shape with nothing in it (no engines, zeros).
    feed, fed_state = DashboardFeed(CollectorRegistry()), None
    while admission.phase is Phase.SERVING:
        state = slot.state
        if state is not fed_state:
            registry = CollectorRegistry() if state is None or state.metrics_registry is None else state.metrics_registry
            feed = DashboardFeed(registry, None if state is None else state.recent_requests)
            fed_state = state
        is_serving = state is not None and slot.status is ModelStatus.LOADED
        engine_status = state.engine_status if state is not None and is_serving else slot.status.value
        frame = {**feed.frame(), "engine_status": engine_status, "model": slot.id}
        yield {"data": json.dumps(frame, separators=(",", ":"))}
        await asyncio.sleep(DASHBOARD_INTERVAL_S)
