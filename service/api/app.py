"""The Starlette app: OpenAI routes, health, models, and OpenAI-shaped errors."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response

from service.anthropic.errors import AnthropicErrorsMiddleware
from service.api.admission import Admission, AdmissionMiddleware, Phase
from service.api.auth import APIKeyMiddleware
from service.api.disconnect import ClientDisconnected
from service.api.errors import error_response
from service.api.gateway_state import GatewayState, ServerState, gateway_of
from service.api.model_routing import ModelRoutingMiddleware
from service.api.origins import OriginMiddleware
from service.api.routes import ROUTES, path_rules
from service.api.sse import DEFAULT_SSE_KEEPALIVE_S
from service.client.core_client import EngineDeadError
from service.openai.errors import APIError, RequestTimeoutError
from service.streams.stream_store import StreamStore

logger = logging.getLogger(__name__)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _request_timeout(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestTimeoutError)
    response = error_response(exc)
    # NOTE: OpenAI's SDKs retry a 408 unless told not to; the retry would only time out again.
    response.headers["x-should-retry"] = "false"
    return response


async def _engine_dead(request: Request, exc: Exception) -> Response:
    return error_response(APIError(str(exc), 503, error_type="server_error", code="engine_dead"))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(APIError(str(exc.detail), exc.status_code, error_type=error_type))


async def _client_gone(request: Request, exc: Exception) -> Response:
    # NOTE: nginx's 499: never delivered (the connection is closed), but counted and logged as such.
    return Response(status_code=499)


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s", request.url.path, exc_info=exc)
    return error_response(APIError(f"Internal error: {exc}", 500, error_type="server_error"))


def create_app(
    state: ServerState | None,
    api_keys: Sequence[str] = (),
    is_metrics_auth: bool = False,
    sse_keepalive_s: float = DEFAULT_SSE_KEEPALIVE_S,
    admission: Admission | None = None,
    stream_store: StreamStore | None = None,
    allowed_origins: Sequence[str] = (),
) -> Starlette:
    """The app; with `state` None it answers 503 "loading" until `attach` hands it one. Pages of
    `allowed_origins` (besides its own) may call it from a browser."""
    if admission is None:
        admission = Admission() if state is None else state.admission
    rules = path_rules(is_metrics_auth)
    # NOTE: innermost, so a request waits for its model's load only once admitted.
    middleware = [Middleware(AdmissionMiddleware, admission=admission, rules=rules), Middleware(ModelRoutingMiddleware, rules=rules)]
    if api_keys:
        open_paths, open_prefixes = rules.keyless
        middleware.insert(0, Middleware(APIKeyMiddleware, api_keys=api_keys, open_paths=open_paths, open_prefixes=open_prefixes))
    middleware.insert(0, Middleware(OriginMiddleware, allowed_origins=allowed_origins))
    if allowed_origins:
        # NOTE: a page of an allowed origin sends JSON and keys, which its browser asks leave for first.
        middleware.insert(0, Middleware(
            CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"], allow_headers=["*"]
        ))
    # NOTE: outermost, so the refusals on /v1/messages (origin, API key, admission) are Anthropic's shape too.
    middleware.insert(0, Middleware(AnthropicErrorsMiddleware, paths=rules.anthropic))
    app = Starlette(
        middleware=middleware,
        routes=[row.starlette_route() for row in ROUTES],
        exception_handlers={
            APIError: _api_error,
            RequestTimeoutError: _request_timeout,
            EngineDeadError: _engine_dead,
            HTTPException: _http_error,
            ClientDisconnected: _client_gone,
            Exception: _unexpected,
        },
    )
    app.state.gateway = GatewayState(admission, stream_store or StreamStore(retention_s=0.0, max_bytes=0), sse_keepalive_s)
    if state is not None:
        attach(app, state)
    return app


def attach_pool(app: Starlette) -> None:
    """Serves the models of the gateway's pool from now on (each loads when asked for), unless a drain has begun."""
    admission = gateway_of(app).admission
    if admission.phase is Phase.LOADING:
        admission.phase = Phase.SERVING


def attach(app: Starlette, state: ServerState) -> None:
    """Serves with `state` from now on (the engine is ready), unless a drain has begun."""
    gateway = gateway_of(app)
    gateway.server = state
    admission = gateway.admission
    if admission.phase is Phase.LOADING:
        admission.phase = Phase.SERVING
