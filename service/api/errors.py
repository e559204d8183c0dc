"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse

M = TypeVar("M", bound=BaseModel)


class APIError(Exception):
    """An error the client gets back as an OpenAI error body."""

    def __init__(
        self,
        message: str,
        status_code: int = 400,
        param: str | None = None,
        error_type: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.error_type = error_type
        self.code = code

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.to_dict(), status_code=error.status_code)


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The raw body, or a 413 as soon as it is known to exceed `max_bytes` (before parsing)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks, num_bytes = [], 0
    async for chunk in request.stream():
        num_bytes += len(chunk)
        if num_bytes > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(max_bytes: int) -> APIError:
    return APIError(f"The request body is larger than {max_bytes} bytes.", 413, code="request_too_large")


async def parse_body(request: Request, model: type[M], max_bytes: int) -> M:
    """Reads and validates a JSON body; every problem is a 400 naming the parameter."""
    raw = await read_body(request, max_bytes)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(f"The request body is not valid JSON: {exc}") from exc
    return validate_body(body, model)


def validate_body(body: Any, model: type[M]) -> M:
    """A parsed JSON body as `model`; every problem is a 400 naming the parameter."""
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"] if not _is_type_tag(part)) or None
        raise APIError(f"Invalid value for '{param}': {first['msg']}", param=param) from exc


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_type_tag(part: int | str) -> bool:
    """True for the union-member names pydantic puts in an error's location (`stop.list[str]`)."""
    return isinstance(part, str) and (part in _TYPE_TAGS or "[" in part or "(" in part)
