"""The Files API, as far as batches need it: POST /v1/files (a JSONL upload, purpose "batch"),
GET /v1/files, GET /v1/files/{file_id}, GET /v1/files/{file_id}/content, DELETE /v1/files/{file_id}."""

from __future__ import annotations

import asyncio

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Message

from service.api.errors import page_limit
from service.api.gateway_state import gateway_of
from service.openai.batch_store import BatchStore
from service.openai.errors import APIError

# NOTE: room for the form around the file: its boundaries, part headers and the 'purpose' field.
_FORM_BYTES = 2**16
# NOTE: OpenAI's largest page of files.
MAX_FILES_PAGE = 10_000


def store_of(request: Request) -> BatchStore:
    """The app's batch store; a 404 where the app keeps none (an app made without a Gateway)."""
    worker = gateway_of(request.app).batches
    if worker is None:
        raise APIError("This server keeps no files or batches (--responses-store off).", 404,
                       error_type="not_found_error", code="batches_off")
    return worker.store


async def upload_file(request: Request) -> Response:
    """Keeps a multipart upload's `file` (UTF-8 JSONL) for `purpose` "batch"."""
    store = store_of(request)
    max_bytes = gateway_of(request.app).max_upload_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes + _FORM_BYTES:
        raise _too_large(max_bytes)
    if not request.headers.get("content-type", "").startswith("multipart/form-data"):
        raise APIError("Upload the file as multipart/form-data with the fields 'file' and 'purpose'.", 415,
                       code="unsupported_media_type")
    # NOTE: counted as it arrives, since a chunked upload declares no length; past the limit the form's
    # parser stops and closes its spooled file.
    async with _bounded(request, max_bytes).form(max_files=1, max_fields=8) as form:
        purpose, upload = form.get("purpose"), form.get("file")
        if purpose != "batch":
            raise APIError(f"'purpose' must be 'batch', got {purpose!r}.", param="purpose")
        if not isinstance(upload, UploadFile):
            raise APIError("The form has no 'file'.", param="file")
        content = await upload.read(max_bytes + 1)
        filename = upload.filename or "upload.jsonl"
    if len(content) > max_bytes:
        raise _too_large(max_bytes)
    try:
        content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(f"The file is not UTF-8 text: {exc}", param="file") from exc
    return JSONResponse(await asyncio.to_thread(store.add_file, filename, purpose, content))


def _bounded(request: Request, max_bytes: int) -> Request:
    """The request, its body read through a count that raises the 413 once past a form of a `max_bytes` file."""
    num_bytes = 0

    async def receive() -> Message:
        nonlocal num_bytes
        message = await request.receive()
        num_bytes += len(message.get("body", b""))
        if num_bytes > max_bytes + _FORM_BYTES:
            raise _too_large(max_bytes)
        return message

    return Request(request.scope, receive)


def _too_large(max_bytes: int) -> APIError:
    return APIError(f"The file is larger than {max_bytes} bytes (--max-upload-bytes).", 413, param="file",
                    code="file_too_large")


async def list_files(request: Request) -> Response:
    """GET /v1/files as OpenAI's: `purpose`, `limit` (1 to 10,000, all by default), `order` (desc, the
    newest first, or asc) and `after` (the last id of the page before)."""
    query = request.query_params
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(f"'order' must be 'asc' or 'desc', got {order!r}.", param="order")
    limit = page_limit(request, default=MAX_FILES_PAGE, maximum=MAX_FILES_PAGE)
    files, has_more = await asyncio.to_thread(
        store_of(request).files, query.get("purpose"), query.get("after"), limit, order
    )
    return JSONResponse({
        "object": "list", "data": files, "first_id": files[0]["id"] if files else None,
        "last_id": files[-1]["id"] if files else None, "has_more": has_more,
    })



async def get_file(request: Request) -> Response:
    file_id = request.path_params["file_id"]
    file = await asyncio.to_thread(store_of(request).file, file_id)
    if file is None:
        raise not_found("file", file_id)
    return JSONResponse(file)


async def get_file_content(request: Request) -> Response:
    file_id = request.path_params["file_id"]
    content = await asyncio.to_thread(store_of(request).file_content, file_id)
    if content is None:
        raise not_found("file", file_id)
    return Response(content, media_type="application/octet-stream")


async def delete_file(request: Request) -> Response:
    file_id = request.path_params["file_id"]
    if not await asyncio.to_thread(store_of(request).delete_file, file_id):
        raise not_found("file", file_id)
    return JSONResponse({"id": file_id, "object": "file", "deleted": True})


def not_found(kind: str, object_id: str) -> APIError:
    return APIError(f"No {kind} with id '{object_id}'.", 404, param=f"{kind}_id", error_type="not_found_error",
                    code=f"{kind}_not_found")
