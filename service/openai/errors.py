"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, and bodies
validated into pydantic models with every problem such an error naming its parameter."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

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


class RequestTimeoutError(APIError):
    """A request ran past the server's request timeout (408; retrying it would time out again)."""


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
