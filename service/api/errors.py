"""HTTP bodies read within a size limit, and OpenAI errors as JSON responses."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse

from service.openai.errors import APIError, validate_body

M = TypeVar("M", bound=BaseModel)

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


def check_content_type(content_type: str | None) -> None:
    """A 415 unless the body is declared JSON (`application/json`, `*/*+json`) or not declared.

    NOTE: as vLLM's FastAPI, a body without a content type is read as JSON; a form or plain text (what
    another site's page may send without asking, and what `curl -d` sends) is not."""
    if content_type is None:
        return
    media_type = content_type.partition(";")[0].strip().lower()
    if media_type != "application/json" and not (media_type.startswith("application/") and media_type.endswith("+json")):
        raise APIError(
            f"The request body's content type '{media_type}' is not supported: send JSON with the header "
            "`Content-Type: application/json` (curl: -H 'Content-Type: application/json').",
            415, code="unsupported_media_type",
        )


def _too_large(max_bytes: int) -> APIError:
    return APIError(f"The request body is larger than {max_bytes} bytes.", 413, code="request_too_large")


async def parse_body(request: Request, model: type[M], max_bytes: int) -> M:
    """Reads and validates a JSON body; every problem is a 400 naming the parameter (a 415 naming
    a content type other than JSON's)."""
    check_content_type(request.headers.get("content-type"))
    raw = await read_body(request, max_bytes)
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(f"The request body is not valid JSON: {exc}") from exc
    return validate_body(body, model)


MAX_PAGE_LIMIT = 100


def page_limit(request: Request, default: int = 20, maximum: int = MAX_PAGE_LIMIT) -> int:
    """A list route's `limit` query parameter, 1 to `maximum` (a 400 naming it otherwise)."""
    text = request.query_params.get("limit", str(default))
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise APIError(f"'limit' must be an integer from 1 to {maximum}, got {text!r}.", param="limit")
    return int(text)
