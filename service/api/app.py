"""The Starlette app: OpenAI routes, health, models, and OpenAI-shaped errors."""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.anthropic.errors import AnthropicErrorsMiddleware
from service.api.admission import PAGE_PATHS, PAGE_PREFIXES, Admission, AdmissionMiddleware, Phase, RequestTimeoutError
from service.api.auth import APIKeyMiddleware
from service.api.batches import batch_routes
from service.api.chat_completions import create_chat_completion
from service.api.completions import create_completion
from service.api.disconnect import ClientDisconnected
from service.api.errors import error_response
from service.api.files import file_routes
from service.api.health import engine_health, live
from service.api.messages import count_message_tokens, create_message
from service.api.metrics_route import metrics
from service.api.model_pool import ModelPool
from service.api.model_routes import model_card, model_routes, pool_health, pool_model_cards
from service.api.model_routing import ModelRoutingMiddleware
from service.api.openapi import openapi
from service.api.origins import OriginMiddleware
from service.api.responses import cancel_response, create_response, delete_response, get_response, list_input_items
from service.api.server_state import ServerState
from service.api.sse import DEFAULT_SSE_KEEPALIVE_S, delete_stream, get_stream, resumable
from service.api.stream_store import StreamStore
from service.api.tokenize import detokenize, tokenize
from service.api.web.routes import web_routes
from service.client.core_client import EngineDeadError
from service.openai.errors import APIError
from service.openai.response_bodies import now

logger = logging.getLogger(__name__)


async def health(request: Request) -> Response:
    """200 only when the engine answers a ping (with several models: while some model can serve); 503
    while loading, draining, or once it is dead."""
    admission: Admission = request.app.state.admission
    if admission.phase is not Phase.SERVING:
        return JSONResponse({"status": admission.phase.value}, status_code=503)
    pool: ModelPool | None = getattr(request.app.state, "pool", None)
    if pool is not None:
        return await pool_health(pool)
    state: ServerState = request.app.state.server
    return await engine_health(state)


async def version(request: Request) -> Response:
    try:
        package_version = importlib.metadata.version("zeroserve")
    except importlib.metadata.PackageNotFoundError:
        package_version = "unknown"
    body: dict[str, object] = {"version": package_version}
    state: ServerState | None = getattr(request.app.state, "server", None)
    pool: ModelPool | None = getattr(request.app.state, "pool", None)
    if pool is not None:
        # NOTE: the first loaded model's engine speaks for the machine (its kernels are its model's); before
        # any model loads, nothing does.
        state = next(iter(pool.loaded_states), None)
    if state is not None:
        # NOTE: what the (first) engine's machine is and what it chose to run each piece of a step on.
        body |= {"cpu": state.llm.ready.cpu, "kernels": state.llm.ready.kernel_choices}
    return JSONResponse(body)


async def list_models(request: Request) -> Response:
    pool: ModelPool | None = getattr(request.app.state, "pool", None)
    if pool is not None:
        return JSONResponse({"object": "list", "data": pool_model_cards(pool)})
    state: ServerState = request.app.state.server
    created = now()
    root, max_model_len = state.served_model_names[0], state.llm.ready.max_model_len
    data = [model_card(name, root, max_model_len, created) for name in state.served_model_names]
    return JSONResponse({"object": "list", "data": data})


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
    # NOTE: innermost, so a request waits for its model's load only once admitted.
    middleware = [Middleware(AdmissionMiddleware, admission=admission), Middleware(ModelRoutingMiddleware)]
    if api_keys:
        # NOTE: everything the pages read (the settings, the dashboard's stream) asks for the key; loading and
        # unloading models too.
        open_paths = {"/health", "/livez", "/openapi.json", *PAGE_PATHS} | (set() if is_metrics_auth else {"/metrics"})
        middleware.insert(0, Middleware(
            APIKeyMiddleware, api_keys=api_keys, open_paths=open_paths, open_prefixes=(*PAGE_PREFIXES, "/health/")
        ))
    middleware.insert(0, Middleware(OriginMiddleware, allowed_origins=allowed_origins))
    if allowed_origins:
        # NOTE: a page of an allowed origin sends JSON and keys, which its browser asks leave for first.
        middleware.insert(0, Middleware(
            CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"], allow_headers=["*"]
        ))
    # NOTE: outermost, so the refusals on /v1/messages (origin, API key, admission) are Anthropic's shape too.
    middleware.insert(0, Middleware(AnthropicErrorsMiddleware))
    app = Starlette(
        middleware=middleware,
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/livez", live, methods=["GET"]),
            Route("/version", version, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/chat/completions", resumable(create_chat_completion), methods=["POST"]),
            Route("/v1/completions", resumable(create_completion), methods=["POST"]),
            Route("/v1/responses", resumable(create_response), methods=["POST"]),
            Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
            Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
            Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
            Route("/v1/messages", resumable(create_message), methods=["POST"]),
            Route("/v1/messages/count_tokens", count_message_tokens, methods=["POST"]),
            Route("/v1/streams/{request_id:path}", get_stream, methods=["GET"]),
            Route("/v1/streams/{request_id:path}", delete_stream, methods=["DELETE"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
            *model_routes(),
            *file_routes(),
            *batch_routes(),
            *web_routes(),
        ],
        exception_handlers={
            APIError: _api_error,
            RequestTimeoutError: _request_timeout,
            EngineDeadError: _engine_dead,
            HTTPException: _http_error,
            ClientDisconnected: _client_gone,
            Exception: _unexpected,
        },
    )
    app.state.admission = admission
    app.state.sse_keepalive_s = sse_keepalive_s
    app.state.streams = stream_store or StreamStore(retention_s=0.0, max_bytes=0)
    if state is not None:
        attach(app, state)
    return app


def attach_pool(app: Starlette) -> None:
    """Serves the models of `app.state.pool` from now on (each loads when asked for), unless a drain has begun."""
    admission: Admission = app.state.admission
    if admission.phase is Phase.LOADING:
        admission.phase = Phase.SERVING


def attach(app: Starlette, state: ServerState) -> None:
    """Serves with `state` from now on (the engine is ready), unless a drain has begun."""
    app.state.server = state
    admission: Admission = app.state.admission
    if admission.phase is Phase.LOADING:
        admission.phase = Phase.SERVING
