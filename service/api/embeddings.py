"""POST /v1/embeddings, as OpenAI has it (an encoder's vectors; a generating model refuses it)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.errors import parse_body
from service.api.gateway_state import ServerState, server_state
from service.openai.embeddings import EmbeddingRequest, create_embeddings
from service.openai.errors import APIError


async def embeddings(request: Request) -> Response:
    state: ServerState = server_state(request)
    body = await parse_body(request, EmbeddingRequest, state.max_request_body_bytes)
    model = state.preparer.model_name(body.model)
    if state.llm.ready.runner != "pooling":
        raise APIError(f"The model '{model}' generates text; it does not embed. Serve an embedding model "
                       "(a BERT-family sentence-transformers folder) for /v1/embeddings.", param="model",
                       code="model_not_supported")
    return JSONResponse(await create_embeddings(state.llm, body, model))
