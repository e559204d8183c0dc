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


async def parse_body(request: Request, model: type[M]) -> M:
    """Reads and validates a JSON body; every problem is a 400 naming the parameter."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(f"The request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise APIError("The request body must be a JSON object.")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        raise APIError(f"Invalid value for '{param}': {first['msg']}", param=param) from exc
