"""The Batch API: POST /v1/batches, GET /v1/batches/{batch_id}, GET /v1/batches (newest first, `after`
and `limit`), POST /v1/batches/{batch_id}/cancel. The batches run in service/openai/batch_worker.py."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.errors import page_limit, parse_body
from service.api.files import not_found, store_of
from service.api.gateway_state import gateway_of
from service.openai.batch_generate import read_line
from service.openai.batch_store import now
from service.openai.batch_worker import BatchWorker, numbered_lines
from service.openai.errors import APIError

COMPLETION_WINDOW_S = 24 * 3600
MAX_BATCH_REQUEST_BYTES = 2**20


class CreateBatchRequest(BaseModel):
    """POST /v1/batches's body; a field this server does not know is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str = Field(description="The path each line is sent to: one the route table lets a batch call.")
    completion_window: Literal["24h"]
    metadata: dict[str, str] | None = Field(default=None, max_length=16)


async def create_batch(request: Request) -> Response:
    """Checks the input file (a JSONL file of purpose "batch") and queues its lines, "validating"
    until the worker starts them."""
    store = store_of(request)
    body = await parse_body(request, CreateBatchRequest, MAX_BATCH_REQUEST_BYTES)
    endpoints = _worker(request).endpoints.bodies
    if body.endpoint not in endpoints:
        raise APIError(f"'endpoint' must be one of {', '.join(map(repr, endpoints))}, got {body.endpoint!r}.",
                       param="endpoint")
    file = await asyncio.to_thread(store.file, body.input_file_id)
    if file is None:
        raise not_found("file", body.input_file_id) from None
    if file["purpose"] != "batch":
        raise APIError(f"The file's purpose is {file['purpose']!r}, not 'batch'.", param="input_file_id")
    content = await asyncio.to_thread(store.file_content, body.input_file_id) or b""
    lines = numbered_lines(content)
    if not lines:
        raise APIError("The input file has no lines.", param="input_file_id", code="empty_file")
    num_lines, errors = len(lines), _duplicate_custom_ids(lines)
    created_at = now()
    batch: dict[str, Any] = {
        "id": f"batch_{uuid.uuid4().hex}", "object": "batch", "endpoint": body.endpoint, "errors": None,
        "input_file_id": body.input_file_id, "completion_window": body.completion_window,
        "status": "validating", "output_file_id": None, "error_file_id": None, "created_at": created_at,
        "in_progress_at": None, "expires_at": created_at + COMPLETION_WINDOW_S, "finalizing_at": None,
        "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None, "cancelled_at": None,
        "request_counts": {"total": num_lines, "completed": 0, "failed": 0}, "metadata": body.metadata,
    }
    if errors:
        # NOTE: as OpenAI's validation: the batch fails whole, before any line runs, its errors naming the lines.
        batch |= {"status": "failed", "failed_at": created_at, "errors": {"object": "list", "data": errors}}
    batch = await asyncio.to_thread(store.add_batch, batch)
    _worker(request).wake()
    return JSONResponse(batch)


async def get_batch(request: Request) -> Response:
    batch_id = request.path_params["batch_id"]
    batch = await asyncio.to_thread(store_of(request).batch, batch_id)
    if batch is None:
        raise not_found("batch", batch_id)
    return JSONResponse(batch)


async def list_batches(request: Request) -> Response:
    after = request.query_params.get("after")
    batches, has_more = await asyncio.to_thread(store_of(request).batches, after, page_limit(request))
    return JSONResponse({
        "object": "list", "data": batches, "first_id": batches[0]["id"] if batches else None,
        "last_id": batches[-1]["id"] if batches else None, "has_more": has_more,
    })


async def cancel_batch(request: Request) -> Response:
    """Stops a batch: "cancelling" until the lines in flight are aborted, then "cancelled", its output
    and error files holding the lines answered by then. A finished batch is a 400."""
    store, batch_id = store_of(request), request.path_params["batch_id"]
    changes = {"status": "cancelling", "cancelling_at": now()}
    batch = await asyncio.to_thread(store.update_batch, batch_id, changes, ("validating", "in_progress"))
    if batch is None:
        current = await asyncio.to_thread(store.batch, batch_id)
        if current is None:
            raise not_found("batch", batch_id)
        if current["status"] != "cancelling":
            raise APIError(f"The batch is {current['status']}; only a running batch can be cancelled.",
                           param="batch_id", code="batch_not_cancellable")
        batch = current
    _worker(request).wake()
    return JSONResponse(batch)


def _duplicate_custom_ids(lines: list[tuple[int, str]]) -> list[dict[str, Any]]:
    """A validation error for each line whose custom_id an earlier line has (1-based lines, as OpenAI's)."""
    seen: dict[str, int] = {}
    errors = []
    for index, text in lines:
        try:
            custom_id = read_line(index, text).custom_id
        except APIError:
            continue  # NOTE: a line that is no request fails alone, in the error file.
        if custom_id is None:
            continue
        if custom_id in seen:
            errors.append({
                "code": "duplicate_custom_id", "param": "custom_id", "line": index + 1,
                "message": f"The custom_id {custom_id!r} is also the custom_id of line {seen[custom_id] + 1}: "
                           "each line's custom_id must be unique in the batch.",
            })
        else:
            seen[custom_id] = index
    return errors


def _worker(request: Request) -> BatchWorker:
    worker = gateway_of(request.app).batches
    assert worker is not None  # NOTE: there, since store_of found its store.
    return worker
