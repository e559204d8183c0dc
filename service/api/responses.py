"""OpenAI's Responses API, answered as the chat request each body converts to. With a store
(--responses-store) a response is kept (`store`, true unless sent false) with the input items it
answered: `previous_response_id` continues from it, GET / DELETE /v1/responses/{id} and its
input_items read it, and `background` answers it detached (polled by GET, ended by cancel)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.admission import Admission
from service.api.disconnect import unless_disconnected
from service.api.errors import page_limit, parse_body
from service.api.gateway_state import ServerState, gateway_of, server_state
from service.api.sse import sse_response
from service.frontend.outputs import collect
from service.openai.errors import APIError
from service.openai.prepare import Prepared
from service.openai.response_bodies import ChatResponse
from service.openai.response_store import UNFINISHED, ResponseExistsError, ResponseStore, StoredResponse
from service.openai.responses_output import (
    CountTokens,
    ResponseEvents,
    items_page,
    new_item_id,
    response_base,
    whole_response,
)
from service.openai.responses_request import ResponsesRequest, responses_params

logger = logging.getLogger(__name__)

Keep = Callable[[dict[str, Any]], Awaitable[None]]


async def create_response(request: Request) -> Response:
    """In order (a re-sent request resumes its stream instead: `resumable`): the body is read, the
    conversation it continues looked up, both converted to a chat request and prepared as one (errors
    name the Responses fields), sent to the engine (detached with `background`), and the chat answer
    goes back converted: a Response whole, or its named events; kept first when stored."""
    state: ServerState = server_state(request)
    store = response_store(request)
    body = await parse_body(request, ResponsesRequest, state.max_request_body_bytes)
    body.check_supported(is_store_on=store is not None)
    history = [] if body.previous_response_id is None else await _continued(store, body.previous_response_id)
    chat = body.to_chat_request(history)
    response_id = new_item_id("resp") if body.request_id is None else f"resp_{body.request_id}"
    is_stored = store is not None and body.is_stored(is_store_on=True)
    if store is not None and is_stored and body.request_id is not None and await asyncio.to_thread(
        store.exists, response_id
    ):
        raise APIError(f"A response with id {response_id!r} is kept already: send another request_id (a kept "
                       "response is never replaced).", param="request_id", code="response_exists")
    with responses_params():
        # NOTE: engine request ids stay unique when two bodies name the same request_id.
        prepared = await state.preparer.prepare(chat, ids=(response_id, new_item_id(response_id)))
    tokenizer = state.llm.tokenizer
    response = ChatResponse(prepared, chat, tokenizer, state.tool_call_parser, state.reasoning_parser)
    base = response_base(body, response_id, prepared.model, response.created, is_stored)
    input_items = [*history, *body.input_items()]

    keep = _keeper(store if is_stored else None, input_items)

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text))

    if body.background:
        queued = base | {"status": "queued"}
        await keep(queued)
        task = asyncio.create_task(_answer_detached(state, prepared, response, base, keep, count_tokens))
        running = _running(request)
        running[response_id] = task
        task.add_done_callback(lambda _: running.pop(response_id, None))
        return JSONResponse(queued)
    with responses_params():
        engine_outputs = state.llm.generate(prepared.engine_requests, prepared.params)
        outputs = await state.admission.guarded(engine_outputs, prepared)
    if body.stream:
        events = _events(response.chunks(outputs), ResponseEvents(base, count_tokens), keep)
        return sse_response(request, state.gateway, events, response_id, is_named=True)
    (output,) = await unless_disconnected(request, collect(outputs, 1, 1))
    answer = whole_response(base, response.whole(output), count_tokens)
    await keep(answer)
    return JSONResponse(answer)


async def get_response(request: Request) -> Response:
    """GET /v1/responses/{id}: a kept response as it is now (a background one polled)."""
    if request.query_params.get("stream", "false").lower() not in ("false", "0"):
        raise APIError("'stream' is not supported when getting a response: poll it instead.", param="stream")
    return JSONResponse((await _stored(request)).response)


async def delete_response(request: Request) -> Response:
    """DELETE /v1/responses/{id}: forgets a kept response (a background one is cancelled first)."""
    response_id = request.path_params["response_id"]
    await _stop(request, response_id)
    store = _store_or_404(request, response_id)
    if not await asyncio.to_thread(store.delete, response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


async def list_input_items(request: Request) -> Response:
    """GET /v1/responses/{id}/input_items: the items a kept response answered (its previous
    responses' first), in OpenAI's list shape: `limit` (1 to 100, 20), `order` (desc or asc), `after`."""
    stored = await _stored(request)
    query = request.query_params
    limit = page_limit(request)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(f"'order' must be 'asc' or 'desc', got {order!r}.", param="order")
    return JSONResponse(items_page(stored.input_items, limit, order, query.get("after")))


async def cancel_response(request: Request) -> Response:
    """POST /v1/responses/{id}/cancel: ends a background response that has not finished (status
    cancelled); one that has finished comes back as it is."""
    response_id = request.path_params["response_id"]
    stored = await _stored(request)
    if not stored.response.get("background"):
        raise APIError("Only a background response can be cancelled.", param="response_id")
    await _stop(request, response_id)
    stored = await _stored(request)
    answer = stored.response
    # NOTE: one started by another gateway process (--api-server-count) is marked here and generates on there.
    if answer["status"] in UNFINISHED:
        answer = answer | {"status": "cancelled"}
        if not await asyncio.to_thread(_store_or_404(request, response_id).update, answer):
            answer = (await _stored(request)).response  # NOTE: it ended meanwhile, in another gateway process.
    return JSONResponse(answer)


def response_store(request: Request) -> ResponseStore | None:
    """The gateway's store (None: --responses-store off, or an app built without one)."""
    return gateway_of(request.app).response_store


def _keeper(store: ResponseStore | None, input_items: list[dict[str, Any]]) -> Keep:
    """Keeps one response as it changes: added the first time, then updated while it is unfinished (a
    cancel or delete stored meanwhile stays); nothing without a store."""
    is_added = False

    async def keep(answer: dict[str, Any]) -> None:
        nonlocal is_added
        if store is None:
            return
        if is_added:
            await asyncio.to_thread(store.update, answer)
            return
        is_added = True
        try:
            await asyncio.to_thread(store.add, answer, input_items)
        except ResponseExistsError as error:
            logger.warning("response not kept: %s", error)

    return keep


async def _answer_detached(
    state: ServerState, prepared: Prepared, response: ChatResponse, base: dict[str, Any], keep: Keep,
    count_tokens: CountTokens,
) -> None:
    """A background response's answer, kept as its status changes; it holds an admission slot, so
    a drain waits for it (and aborts it at the end, as a stream)."""
    admission: Admission = state.admission
    admission.acquire()
    try:
        await keep(base)
        engine_outputs = state.llm.generate(prepared.engine_requests, prepared.params)
        outputs = await admission.guarded(engine_outputs, prepared)
        (output,) = await collect(outputs, 1, 1)
        await keep(whole_response(base, response.whole(output), count_tokens))
    except APIError as error:
        await keep(base | {"status": "failed", "error": {"code": error.code or error.error_type,
                                                         "message": error.message}})
    except Exception as error:  # noqa: BLE001 - a background response ends failed, never in_progress
        logger.warning("background response %s failed: %s", base["id"], error)
        await keep(base | {"status": "failed", "error": {"code": "server_error", "message": str(error)}})
    finally:
        admission.release()


async def _events(
    chunks: AsyncIterator[dict[str, Any]], events: ResponseEvents, keep: Keep
) -> AsyncIterator[dict[str, Any]]:
    """The Responses events of a chat stream; the final response is kept before its event goes out,
    so a client may continue from it as soon as it reads it."""
    for event in events.opening():
        yield event
    async for chunk in chunks:
        for event in events.feed(chunk):
            yield event
    closing = events.closing()
    await keep(closing[-1]["response"])
    for event in closing:
        yield event


async def _continued(store: ResponseStore | None, response_id: str) -> list[dict[str, Any]]:
    """The conversation `previous_response_id` continues: its input items, then its output."""
    stored = None if store is None else await asyncio.to_thread(store.get, response_id)
    if stored is None:
        raise _not_found(response_id, param="previous_response_id")
    if stored.response["status"] in UNFINISHED:
        raise APIError(f"Response {response_id!r} has not finished ({stored.response['status']}): wait for it "
                       "before continuing from it.", param="previous_response_id")
    return stored.conversation


async def _stored(request: Request) -> StoredResponse:
    response_id = request.path_params["response_id"]
    stored = await asyncio.to_thread(_store_or_404(request, response_id).get, response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


async def _stop(request: Request, response_id: str) -> None:
    """Cancels the background response's task in this process, if it runs here, and waits for it to end."""
    task = _running(request).get(response_id)
    if task is not None:
        task.cancel()
        await asyncio.wait([task])


def _running(request: Request) -> dict[str, asyncio.Task[None]]:
    """This process's background responses that have not finished, by id."""
    return gateway_of(request.app).background_responses


def _store_or_404(request: Request, response_id: str) -> ResponseStore:
    store = response_store(request)
    if store is None:
        error = _not_found(response_id)
        error.message += " This server keeps no responses (--responses-store off)."
        raise error
    return store


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(f"Response with id {response_id!r} not found.", 404, param=param)
