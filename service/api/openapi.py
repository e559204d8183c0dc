"""The API's OpenAPI 3.1 document, built from the route table's rows (routes.py) and the same pydantic models
the routes validate their bodies with (so API fuzzers and client generators see what is checked)."""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic.json_schema import models_json_schema

if TYPE_CHECKING:
    from service.api.routes import ApiRoute

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {"error": {"type": "object", "properties": {
        "message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]},
    }, "required": ["message", "type", "param", "code"]}},
    "required": ["error"],
}
# What each error status a route documents means.
_ERRORS = {
    "400": "A bad request, naming its parameter.", "404": "No such model.", "413": "The body is too large.",
    "415": "The body is not JSON.", "429": "Too many requests in flight.", "503": "No engine is serving.",
}


def build_document(routes: Sequence[ApiRoute]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `routes`: each row an operation, its path's parameters from the path."""
    models = list(dict.fromkeys(row.body for row in routes if row.body is not None))
    refs, top = models_json_schema([(model, "validation") for model in models], ref_template="#/components/schemas/{model}")
    errors = {
        status: {"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for status, description in _ERRORS.items()
    }
    paths: dict[str, Any] = {}
    for row in routes:
        operation: dict[str, Any] = {"summary": row.summary}
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"{(\w+)}", row.openapi_path)
        ] + list(row.parameters)
        if parameters:
            operation["parameters"] = parameters
        if row.body is not None:
            schema = refs[(row.body, "validation")]
            operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        elif row.other_body is not None:
            operation["requestBody"] = row.other_body
        operation["responses"] = {"200": {"description": row.answer or row.summary}, **{s: errors[s] for s in row.errors}}
        paths.setdefault(row.openapi_path, {})[row.method.lower()] = operation
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
