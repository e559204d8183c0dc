"""The pooling routes, an encoder's (a generating model refuses them): POST /v1/embeddings as OpenAI has it,
/v1/rerank (and /rerank) as vLLM, Jina and Cohere have it, /v1/score as vLLM has it."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from service.api.errors import parse_body
from service.api.gateway_state import ServerState, server_state
from service.openai.embeddings import EmbeddingRequest, create_embeddings
from service.openai.errors import APIError
from service.openai.scores import RerankRequest, ScoreRequest, rerank, score

B = TypeVar("B", bound=BaseModel)


async def embeddings(request: Request) -> Response:
    state, body, model = await _pooling_body(request, EmbeddingRequest)
    return _json(await create_embeddings(state.llm, body, model))


async def rerank_documents(request: Request) -> Response:
    state, body, model = await _pooling_body(request, RerankRequest)
    return _json(await rerank(state.llm, body, model))


async def score_pairs(request: Request) -> Response:
    state, body, model = await _pooling_body(request, ScoreRequest)
    return _json(await score(state.llm, body, model))


def _json(body: dict[str, Any]) -> Response:
    """`body` as JSON, written by orjson: a vector of 384 floats takes it 7 us, Starlette's json.dumps 160."""
    return Response(orjson.dumps(body), media_type="application/json")


async def _pooling_body(request: Request, model_type: type[B]) -> tuple[ServerState, B, str]:
    """The model's state, the validated body and the served name it asks for; a 400 naming `model` where
    that model generates instead."""
    state: ServerState = server_state(request)
    body = await parse_body(request, model_type, state.max_request_body_bytes)
    model = state.preparer.model_name(getattr(body, "model", None))
    if state.llm.ready.runner != "pooling":
        raise APIError(f"The model '{model}' generates text; it does not embed or score. Serve an embedding model "
                       "or a cross-encoder (a BERT-family folder) for this route.", param="model",
                       code="model_not_supported")
    return state, body, model
