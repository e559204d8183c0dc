"""Every route the gateway serves, one row each (`ROUTES`): its path, method and handler, what the OpenAPI
document says of it, and the facts the rest of the gateway derives from it. `app.py` builds Starlette's routes
from the rows, `openapi.py` the document; model routing, admission and the API key check take their paths from
them (`PathRules`). A new route is its handler and one row."""

from __future__ import annotations

import enum
import functools
import importlib.metadata
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from service.anthropic.protocol import CountTokensRequest, MessagesRequest
from service.api.admission import PathRules, Phase
from service.api.batches import CreateBatchRequest, cancel_batch, create_batch, get_batch, list_batches
from service.api.chat_completions import create_chat_completion
from service.api.completions import create_completion
from service.api.files import delete_file, get_file, get_file_content, list_files, upload_file
from service.api.gateway_state import gateway_of
from service.api.health import engine_health, live
from service.api.messages import count_message_tokens, create_message
from service.api.metrics_route import metrics
from service.api.model_routes import load_model, model_card, model_health, pool_health, pool_model_cards, unload_model
from service.api.openapi import build_document
from service.api.pooling import embeddings, rerank_documents, score_pairs
from service.api.responses import cancel_response, create_response, delete_response, get_response, list_input_items
from service.api.sse import delete_stream, get_stream, resumable
from service.api.tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from service.api.web.routes import STATIC_DIR, dashboard, dashboard_events, playground, playground_settings
from service.openai.batch_generate import BatchEndpoints
from service.openai.embeddings import EmbeddingRequest
from service.openai.protocol import ChatCompletionRequest, CompletionRequest
from service.openai.response_bodies import now
from service.openai.responses_request import ResponsesRequest
from service.openai.scores import RerankRequest, ScoreRequest

Endpoint = Callable[[Request], Awaitable[Response]]


class Key(enum.Enum):
    """Whether a route asks for the API key (where the server has keys)."""

    REQUIRED = "required"
    OPEN = "open"
    METRICS = "as --metrics-auth says"


@dataclass(frozen=True)
class ApiRoute:
    """One path and method: its handler (or, with `files`, a folder of files under the path) and its facts."""

    path: str  # Starlette's, converters included (`{model_id:path}`)
    method: str
    endpoint: Endpoint | None
    summary: str  # what it does (OpenAPI)
    body: type[BaseModel] | None = None  # the JSON body's model, which validates it
    other_body: dict[str, Any] | None = None  # OpenAPI's requestBody of a body no model validates
    parameters: tuple[dict[str, Any], ...] = ()  # its query and header parameters (the path's come from the path)
    answer: str = ""  # what a 200 holds (default: the summary)
    errors: tuple[str, ...] = ()  # the error statuses it documents
    is_model_routed: bool = False  # its body names the model it runs on (a multi-model gateway loads it first)
    is_generation: bool = False  # a generation: counted in flight, capped by --max-num-seqs' queue
    is_resumable: bool = False  # its streams may be kept for resumption (--stream-retention)
    is_anthropic: bool = False  # its errors take Anthropic's shape
    is_batch_endpoint: bool = False  # a batch's lines may name it (the Batch API, `zeroserve generate`)
    key: Key = Key.REQUIRED
    is_open_while_loading: bool = False  # served before the model is ready (admission)
    is_open_while_draining: bool = False  # served while the server shuts down
    files: str | None = None  # a folder served under the path's prefix (the pages' scripts)

    @property
    def openapi_path(self) -> str:
        """The path as an OpenAPI template: converters dropped (`{model_id:path}` -> `{model_id}`)."""
        return re.sub(r":\w+}", "}", self.path)

    @property
    def prefix(self) -> str | None:
        """What every path of a templated route starts with (`/health/`), or None for a fixed path."""
        return self.path[: self.path.index("{")] if "{" in self.path else None

    def starlette_route(self) -> BaseRoute:
        if self.files is not None:
            assert self.prefix is not None
            return Mount(self.prefix.rstrip("/"), StaticFiles(directory=self.files), name="static")
        assert self.endpoint is not None
        endpoint = resumable(self.endpoint) if self.is_resumable else self.endpoint
        return Route(self.path, endpoint, methods=[self.method])


async def health(request: Request) -> Response:
    """200 only when the engine answers a ping (with several models: while some model can serve); 503
    while loading, draining, or once it is dead."""
    gateway = gateway_of(request.app)
    if gateway.admission.phase is not Phase.SERVING:
        return JSONResponse({"status": gateway.admission.phase.value}, status_code=503)
    if gateway.pool is not None:
        return await pool_health(gateway.pool)
    return await engine_health(gateway.one_model())


async def version(request: Request) -> Response:
    try:
        package_version = importlib.metadata.version("zeroserve")
    except importlib.metadata.PackageNotFoundError:
        package_version = "unknown"
    body: dict[str, object] = {"version": package_version}
    gateway = gateway_of(request.app)
    state, pool = gateway.server, gateway.pool
    if pool is not None:
        # NOTE: the first loaded model's engine speaks for the machine (its kernels are its model's); before
        # any model loads, nothing does.
        state = next(iter(pool.loaded_states), None)
    if state is not None:
        # NOTE: what the (first) engine's machine is and what it chose to run each piece of a step on.
        body |= {"cpu": state.llm.ready.cpu, "kernels": state.llm.ready.kernel_choices}
    return JSONResponse(body)


async def list_models(request: Request) -> Response:
    gateway = gateway_of(request.app)
    if gateway.pool is not None:
        return JSONResponse({"object": "list", "data": pool_model_cards(gateway.pool)})
    state = gateway.one_model()
    created = now()
    root, max_model_len = state.served_model_names[0], state.llm.ready.max_model_len
    data = [model_card(name, root, max_model_len, created) for name in state.served_model_names]
    return JSONResponse({"object": "list", "data": data})


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route (built once)."""
    return build_document(ROUTES)


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())


# The error statuses a route that takes a JSON body answers, and what its 200 holds.
BODY_ERRORS = ("400", "404", "413", "415", "429", "503")
_ANSWER = "The answer (JSON, or server-sent events when streamed)."
_LIMIT = {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1, "maximum": 100}}
_AFTER = {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}}
_MODEL_BODY = {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["model"], "properties": {"model": {"type": "string"}},
}}}}
_UPLOAD_BODY = {"required": True, "content": {"multipart/form-data": {"schema": {
    "type": "object", "required": ["file", "purpose"],
    "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"const": "batch"}},
}}}}
_LOAD = "Loads a model (again, if it failed) and answers once it is loaded or failed."
_UNLOAD = "Unloads a model now, aborting what it still runs."
_WITH_STATUS = "The model with its status."

ROUTES: tuple[ApiRoute, ...] = (
    ApiRoute("/health", "GET", health, "200 while an engine answers, else 503 with the reason (readiness).",
             key=Key.OPEN, is_open_while_loading=True, is_open_while_draining=True),
    ApiRoute("/livez", "GET", live, "200 while the gateway process runs, engines or not (liveness).",
             key=Key.OPEN, is_open_while_loading=True, is_open_while_draining=True),
    ApiRoute("/version", "GET", version, "The package version, the engine's CPU and what runs each piece of a step.",
             is_open_while_loading=True, is_open_while_draining=True),
    ApiRoute("/metrics", "GET", metrics, "Prometheus metrics (text).", key=Key.METRICS, is_open_while_draining=True),
    ApiRoute("/openapi.json", "GET", openapi, "This document.", key=Key.OPEN),
    ApiRoute("/v1/models", "GET", list_models, "The served models and their aliases; with several, each one's status "
             "(loaded, loading, unloaded, failed with the reason)."),
    ApiRoute("/v1/chat/completions", "POST", create_chat_completion,
             "A chat answer, whole or streamed (text/event-stream).", body=ChatCompletionRequest, answer=_ANSWER,
             errors=BODY_ERRORS, is_model_routed=True, is_generation=True, is_resumable=True, is_batch_endpoint=True),
    ApiRoute("/v1/completions", "POST", create_completion, "Completions of one or more prompts, whole or streamed.",
             body=CompletionRequest, answer=_ANSWER, errors=BODY_ERRORS, is_model_routed=True, is_generation=True,
             is_resumable=True, is_batch_endpoint=True),
    ApiRoute("/v1/responses", "POST", create_response, "OpenAI's Responses API, whole, streamed or in the background; "
             "kept unless 'store' is false.", body=ResponsesRequest, answer=_ANSWER, errors=BODY_ERRORS,
             is_model_routed=True, is_generation=True, is_resumable=True),
    ApiRoute("/v1/responses/{response_id}", "GET", get_response, "A kept Response as it is now (a background one polled)."),
    ApiRoute("/v1/responses/{response_id}", "DELETE", delete_response,
             "Forgets a kept Response (a background one is cancelled first).", answer="The response was deleted.",
             errors=("404",)),
    ApiRoute("/v1/responses/{response_id}/input_items", "GET", list_input_items,
             "The items a kept Response answered, in OpenAI's list shape.", parameters=(
                 _LIMIT, {"name": "order", "in": "query", "required": False, "schema": {"enum": ["asc", "desc"]}}, _AFTER,
             )),
    ApiRoute("/v1/responses/{response_id}/cancel", "POST", cancel_response,
             "Cancels a background Response that has not finished.", answer="The response, cancelled.",
             errors=("400", "404")),
    ApiRoute("/v1/embeddings", "POST", embeddings, "Vectors of texts or token ids (an embedding model's).",
             body=EmbeddingRequest, answer=_ANSWER, errors=BODY_ERRORS, is_model_routed=True, is_generation=True),
    ApiRoute("/v1/rerank", "POST", rerank_documents, "Documents ordered by their score against a query, best first "
             "(a cross-encoder's, or the cosine of an embedding model's vectors).", body=RerankRequest, answer=_ANSWER,
             errors=BODY_ERRORS, is_model_routed=True, is_generation=True),
    # NOTE: as llama.cpp's server names it.
    ApiRoute("/rerank", "POST", rerank_documents, "As /v1/rerank.", body=RerankRequest, answer=_ANSWER,
             errors=BODY_ERRORS, is_model_routed=True, is_generation=True),
    ApiRoute("/v1/score", "POST", score_pairs, "Scores of text pairs: text_1 against each text_2, or pair by pair.",
             body=ScoreRequest, answer=_ANSWER, errors=BODY_ERRORS, is_model_routed=True, is_generation=True),
    ApiRoute("/v1/messages", "POST", create_message, "Anthropic's Messages API, whole or streamed.",
             body=MessagesRequest, answer=_ANSWER, errors=BODY_ERRORS, is_model_routed=True, is_generation=True,
             is_resumable=True, is_anthropic=True),
    ApiRoute("/v1/messages/count_tokens", "POST", count_message_tokens,
             "The prompt tokens a Messages body would be charged.", body=CountTokensRequest, answer=_ANSWER,
             errors=BODY_ERRORS, is_model_routed=True, is_anthropic=True),
    ApiRoute("/v1/streams/{request_id:path}", "GET", get_stream, "A kept stream (--stream-retention) as server-sent "
             "events, from the event after Last-Event-ID: by its response id or the X-Request-Id it was sent with.",
             parameters=({"name": "Last-Event-ID", "in": "header", "required": False,
                          "schema": {"type": "string", "pattern": "^[0-9]+$"}},)),
    ApiRoute("/v1/streams/{request_id:path}", "DELETE", delete_stream, "Aborts a kept stream's request now.",
             answer="The stream was aborted.", errors=("404",)),
    ApiRoute("/tokenize", "POST", tokenize, "Text or chat messages as token ids.", body=TokenizeRequest,
             answer=_ANSWER, errors=BODY_ERRORS, is_model_routed=True),
    ApiRoute("/detokenize", "POST", detokenize, "Token ids as text.", body=DetokenizeRequest, answer=_ANSWER,
             errors=BODY_ERRORS, is_model_routed=True),
    ApiRoute("/v1/models/{model_id:path}/load", "POST", load_model, _LOAD, answer=_WITH_STATUS, errors=("400", "404")),
    ApiRoute("/v1/models/{model_id:path}/unload", "POST", unload_model, _UNLOAD, answer=_WITH_STATUS,
             errors=("400", "404")),
    # NOTE: as llama.cpp's router takes them: a body naming the model.
    ApiRoute("/models/load", "POST", load_model, _LOAD, other_body=_MODEL_BODY, answer=_WITH_STATUS, errors=("400", "404")),
    ApiRoute("/models/unload", "POST", unload_model, _UNLOAD, other_body=_MODEL_BODY, answer=_WITH_STATUS,
             errors=("400", "404")),
    ApiRoute("/health/{model_id:path}", "GET", model_health,
             "With several models: 200 while that model is loaded and answers, else 503 with its status.", key=Key.OPEN),
    ApiRoute("/v1/files", "POST", upload_file, "Keeps a JSONL file of batch lines (multipart/form-data: file, purpose "
             "'batch').", other_body=_UPLOAD_BODY, answer="The file object.", errors=("400", "413")),
    ApiRoute("/v1/files", "GET", list_files, "The kept files (batch inputs and outputs), newest first.",
             parameters=({"name": "purpose", "in": "query", "required": False, "schema": {"type": "string"}},)),
    ApiRoute("/v1/files/{file_id}", "GET", get_file, "A kept file's `file` object."),
    ApiRoute("/v1/files/{file_id}", "DELETE", delete_file, "Deletes a kept file.", answer="The file was deleted.",
             errors=("404",)),
    ApiRoute("/v1/files/{file_id}/content", "GET", get_file_content,
             "A kept file's bytes (a batch's output or error file: JSONL)."),
    ApiRoute("/v1/batches", "POST", create_batch,
             "Runs a file's lines through the engine at a lower priority than interactive requests.",
             body=CreateBatchRequest, answer="The batch, validating.", errors=("400", "404")),
    ApiRoute("/v1/batches", "GET", list_batches, "The batches, newest first, a page at a time.", parameters=(_LIMIT, _AFTER)),
    ApiRoute("/v1/batches/{batch_id}", "GET", get_batch,
             "A batch as it is now: its status, request_counts and, once done, its files."),
    ApiRoute("/v1/batches/{batch_id}/cancel", "POST", cancel_batch,
             "Cancels a running batch; its files keep the lines answered by then.", answer="The batch, cancelling.",
             errors=("400", "404")),
    # NOTE: the pages are open while loading, so a page can say the model is loading, and open without an API key,
    # since they show nothing until given it; what they read (their settings, the dashboard's stream) asks for it.
    ApiRoute("/", "GET", playground, "The playground: a chat page (HTML).", key=Key.OPEN, is_open_while_loading=True,
             is_open_while_draining=True),
    ApiRoute("/dashboard", "GET", dashboard, "The live view of the engines (HTML).", key=Key.OPEN,
             is_open_while_loading=True, is_open_while_draining=True),
    ApiRoute("/playground/settings", "GET", playground_settings,
             "The served models and the sampling values a request that names none gets."),
    ApiRoute("/dashboard/events", "GET", dashboard_events,
             "The dashboard's figures (those of /metrics) as server-sent events, about one a second."),
    ApiRoute("/static/{path:path}", "GET", None,
             "The pages' scripts and styles, and the scripts they vendor with their licences.", key=Key.OPEN,
             is_open_while_loading=True, files=str(STATIC_DIR)),
)


def path_rules(is_metrics_auth: bool = False) -> PathRules:
    """The paths each middleware treats apart, from the rows (a templated row by its prefix)."""

    def paths(rows: list[ApiRoute]) -> tuple[frozenset[str], tuple[str, ...]]:
        return (frozenset(row.path for row in rows if row.prefix is None),
                tuple(sorted({row.prefix for row in rows if row.prefix is not None})))

    keyless = [row for row in ROUTES if row.key is Key.OPEN or (row.key is Key.METRICS and not is_metrics_auth)]
    return PathRules(
        keyless=paths(keyless),
        open_while_loading=paths([row for row in ROUTES if row.is_open_while_loading]),
        open_while_draining=paths([row for row in ROUTES if row.is_open_while_draining]),
        generation=frozenset(row.path for row in ROUTES if row.is_generation),
        model_routed=frozenset(row.path for row in ROUTES if row.is_model_routed),
        anthropic=tuple(row.path for row in ROUTES if row.is_anthropic),
    )


def batch_endpoints() -> BatchEndpoints:
    """The paths a batch's lines may name, each with its body: the rows the Batch API may call."""
    bodies: dict[str, type[ChatCompletionRequest | CompletionRequest]] = {}
    for row in ROUTES:
        if row.is_batch_endpoint:
            assert row.body is not None and issubclass(row.body, ChatCompletionRequest | CompletionRequest), row.path
            bodies[row.path] = row.body
    return BatchEndpoints(bodies)
