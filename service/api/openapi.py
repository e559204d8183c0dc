"""GET /openapi.json: the API's OpenAPI 3.1 document, generated from the same pydantic models the
routes validate their bodies with (so API fuzzers and client generators see what is checked)."""

from __future__ import annotations

import functools
import importlib.metadata
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.anthropic.protocol import CountTokensRequest, MessagesRequest
from service.api.batches import CreateBatchRequest
from service.api.tokenize import DetokenizeRequest, TokenizeRequest
from service.openai.protocol import ChatCompletionRequest, CompletionRequest
from service.openai.responses_request import ResponsesRequest

# (path, request body model, what it does): the routes that take a JSON body.
BODY_ROUTES: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("/v1/chat/completions", ChatCompletionRequest, "A chat answer, whole or streamed (text/event-stream)."),
    ("/v1/completions", CompletionRequest, "Completions of one or more prompts, whole or streamed."),
    ("/v1/responses", ResponsesRequest, "OpenAI's Responses API, whole, streamed or in the background; kept "
     "unless 'store' is false."),
    ("/v1/messages", MessagesRequest, "Anthropic's Messages API, whole or streamed."),
    ("/v1/messages/count_tokens", CountTokensRequest, "The prompt tokens a Messages body would be charged."),
    ("/tokenize", TokenizeRequest, "Text or chat messages as token ids."),
    ("/detokenize", DetokenizeRequest, "Token ids as text."),
)
# (path, what it returns): the routes read with GET.
GET_ROUTES: tuple[tuple[str, str], ...] = (
    ("/health", "200 while an engine answers, else 503 with the reason (readiness)."),
    ("/livez", "200 while the gateway process runs, engines or not (liveness)."),
    ("/version", "The package version, the engine's CPU and what runs each piece of a step."),
    ("/v1/models", "The served models and their aliases; with several, each one's status (loaded, loading, "
     "unloaded, failed with the reason)."),
    ("/health/{model_id}", "With several models: 200 while that model is loaded and answers, else 503 with its status."),
    ("/metrics", "Prometheus metrics (text)."),
    ("/v1/streams/{request_id}", "A kept stream (--stream-retention) as server-sent events, from the event after "
     "Last-Event-ID: by its response id or the X-Request-Id it was sent with."),
    ("/v1/responses/{response_id}", "A kept Response as it is now (a background one polled)."),
    ("/v1/responses/{response_id}/input_items", "The items a kept Response answered, in OpenAI's list shape."),
    ("/v1/files", "The kept files (batch inputs and outputs), newest first."),
    ("/v1/files/{file_id}", "A kept file's `file` object."),
    ("/v1/files/{file_id}/content", "A kept file's bytes (a batch's output or error file: JSONL)."),
    ("/v1/batches", "The batches, newest first, a page at a time."),
    ("/v1/batches/{batch_id}", "A batch as it is now: its status, request_counts and, once done, its files."),
    ("/", "The playground: a chat page (HTML)."),
    ("/dashboard", "The live view of the engines (HTML)."),
    ("/playground/settings", "The served models and the sampling values a request that names none gets."),
    ("/dashboard/events", "The dashboard's figures (those of /metrics) as server-sent events, about one a second."),
    ("/static/{path}", "The pages' scripts and styles, and the scripts they vendor with their licences."),
)
_RESPONSE_ID = {"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}
_FILE_ID = {"name": "file_id", "in": "path", "required": True, "schema": {"type": "string"}}
_MODEL_ID = {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
_BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"}}
# The parameters of the GET routes that take any.
_GET_PARAMETERS: dict[str, list[dict[str, Any]]] = {
    "/v1/streams/{request_id}": [
        {"name": "request_id", "in": "path", "required": True, "schema": {"type": "string"}},
        {"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    ],
    "/static/{path}": [{"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}],
    "/v1/responses/{response_id}": [_RESPONSE_ID],
    "/v1/responses/{response_id}/input_items": [
        _RESPONSE_ID,
        {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
        {"name": "order", "in": "query", "required": False, "schema": {"enum": ["asc", "desc"]}},
        {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
    ],
    "/v1/files": [{"name": "purpose", "in": "query", "required": False, "schema": {"type": "string"}}],
    "/v1/files/{file_id}": [_FILE_ID],
    "/v1/files/{file_id}/content": [_FILE_ID],
    "/v1/batches": [
        {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
        {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
    ],
    "/v1/batches/{batch_id}": [_BATCH_ID],
    "/health/{model_id}": [_MODEL_ID],
}

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {"error": {"type": "object", "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]},
    }, "required": ["message", "type", "param", "code"]}},
    "required": ["error"],
}


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route (built once)."""
    refs, top = models_json_schema(
        [(model, "validation") for _, model, _ in BODY_ROUTES], ref_template="#/components/schemas/{model}"
    )
    errors = {
        status: {"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for status, description in (("400", "A bad request, naming its parameter."), ("404", "No such model."),
                                    ("413", "The body is too large."), ("415", "The body is not JSON."),
                                    ("429", "Too many requests in flight."), ("503", "No engine is serving."))
    }
    paths: dict[str, Any] = {}
    for path, model, summary in BODY_ROUTES:
        paths[path] = {"post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": refs[(model, "validation")]}}},
            "responses": {"200": {"description": "The answer (JSON, or server-sent events when streamed)."}, **errors},
        }}
    for path, summary in GET_ROUTES:
        paths[path] = {"get": {"summary": summary, "responses": {"200": {"description": summary}}}}
        if path in _GET_PARAMETERS:
            paths[path]["get"]["parameters"] = _GET_PARAMETERS[path]
    paths["/v1/streams/{request_id}"]["delete"] = {
        "summary": "Aborts a kept stream's request now.", "parameters": _GET_PARAMETERS["/v1/streams/{request_id}"][:1],
        "responses": {"200": {"description": "The stream was aborted."}, "404": errors["404"]},
    }
    paths["/v1/responses/{response_id}"]["delete"] = {
        "summary": "Forgets a kept Response (a background one is cancelled first).", "parameters": [_RESPONSE_ID],
        "responses": {"200": {"description": "The response was deleted."}, "404": errors["404"]},
    }
    paths["/v1/responses/{response_id}/cancel"] = {"post": {
        "summary": "Cancels a background Response that has not finished.", "parameters": [_RESPONSE_ID],
        "responses": {"200": {"description": "The response, cancelled."}, "400": errors["400"], "404": errors["404"]},
    }}
    _add_batch_paths(paths, errors)
    _add_model_paths(paths, errors)
    try:
        version = importlib.metadata.version("zeroserve")
    except importlib.metadata.PackageNotFoundError:
        version = "0.0.0"
    return {
        "openapi": "3.1.0",
        "info": {"title": "zeroserve", "version": version},
        "paths": paths,
        "components": {"schemas": {**top.get("$defs", {}), "Error": _ERROR_SCHEMA}},
    }


def _add_batch_paths(paths: dict[str, Any], errors: dict[str, Any]) -> None:
    """The Files and Batch APIs' other methods: an upload (multipart), a batch's creation and cancel, a deletion."""
    paths["/v1/files"]["post"] = {
        "summary": "Keeps a JSONL file of batch lines (multipart/form-data: file, purpose 'batch').",
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
            "type": "object", "required": ["file", "purpose"],
            "properties": {"file": {"type": "string", "format": "binary"}, "purpose": {"const": "batch"}},
        }}}},
        "responses": {"200": {"description": "The file object."}, "400": errors["400"], "413": errors["413"]},
    }
    paths["/v1/files/{file_id}"]["delete"] = {
        "summary": "Deletes a kept file.", "parameters": [_FILE_ID],
        "responses": {"200": {"description": "The file was deleted."}, "404": errors["404"]},
    }
    paths["/v1/batches"]["post"] = {
        "summary": "Runs a file's lines through the engine at a lower priority than interactive requests.",
        "requestBody": {"required": True, "content": {"application/json": {"schema": CreateBatchRequest.model_json_schema()}}},
        "responses": {"200": {"description": "The batch, validating."}, "400": errors["400"], "404": errors["404"]},
    }
    paths["/v1/batches/{batch_id}/cancel"] = {"post": {
        "summary": "Cancels a running batch; its files keep the lines answered by then.", "parameters": [_BATCH_ID],
        "responses": {"200": {"description": "The batch, cancelling."}, "400": errors["400"], "404": errors["404"]},
    }}


def _add_model_paths(paths: dict[str, Any], errors: dict[str, Any]) -> None:
    """A multi-model server's load and unload, by path and as llama.cpp's router takes them (a body naming the model)."""
    by_body = {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "required": ["model"], "properties": {"model": {"type": "string"}},
    }}}}
    for action, summary in (("load", "Loads a model (again, if it failed) and answers once it is loaded or failed."),
                            ("unload", "Unloads a model now, aborting what it still runs.")):
        responses = {"200": {"description": "The model with its status."}, "400": errors["400"], "404": errors["404"]}
        paths[f"/v1/models/{{model_id}}/{action}"] = {"post": {
            "summary": summary, "parameters": [_MODEL_ID], "responses": responses,
        }}
        paths[f"/models/{action}"] = {"post": {"summary": summary, "requestBody": by_body, "responses": responses}}


async def openapi(request: Request) -> Response:
    return JSONResponse(openapi_document())
