"""The Starlette app: OpenAI routes, health, models, and OpenAI-shaped errors."""

from __future__ import annotations

import logging

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from service.api.chat_completions import create_chat_completion
from service.api.completions import create_completion
from service.api.errors import APIError, error_response
from service.api.server_state import ServerState, now
from service.api.tokenize import detokenize, tokenize
from service.core_client import EngineDeadError

logger = logging.getLogger(__name__)


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if state.llm.is_dead:
        return JSONResponse({"status": "dead"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def list_models(request: Request) -> Response:
    state: ServerState = request.app.state.server
    created = now()
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "zeroserve",
            "root": state.served_model_names[0],
            "max_model_len": state.llm.ready.max_model_len,
        }
        for name in state.served_model_names
    ]
    return JSONResponse({"object": "list", "data": data})


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _engine_dead(request: Request, exc: Exception) -> Response:
    return error_response(APIError(str(exc), 503, error_type="server_error", code="engine_dead"))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error_type = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error_response(APIError(str(exc.detail), exc.status_code, error_type=error_type))


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s", request.url.path, exc_info=exc)
    return error_response(APIError(f"Internal error: {exc}", 500, error_type="server_error"))


def create_app(state: ServerState) -> Starlette:
    app = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
            Route("/v1/completions", create_completion, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/detokenize", detokenize, methods=["POST"]),
        ],
        exception_handlers={
            APIError: _api_error,
            EngineDeadError: _engine_dead,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
    app.state.server = state
    return app
