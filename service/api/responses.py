"""OpenAI's Responses API, answered as the chat request each body converts to. With a store
(--responses-store) a response is kept (`store`, true unless sent false) with the input items it
answered: `previous_response_id` continues from it, GET / DELETE /v1/responses/{id} and its
input_items read it, and `background` answers it detached (polled by GET, ended by cancel)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.disconnect import unless_disconnected
from service.api.errors import page_limit, parse_body
from service.api.gateway_state import ServerState, gateway_of, server_state
from service.api.sse import sse_response
from service.openai.background_responses import keeper
from service.openai.errors import APIError
from service.openai.response_bodies import ChatResponse, Outputs
from service.openai.response_store import UNFINISHED, ResponseStore, StoredResponse
from service.openai.responses_output import ResponseEvents, items_page, new_item_id, response_base
from service.openai.responses_request import ResponsesRequest

logger = logging.getLogger(__name__)

async def create_response(request: Request) -> Response:
    """In order (a re-sent request resumes its stream instead: `resumable`): the body is read, the
    conversation it continues looked up, both converted to a chat request and prepared as one (errors
    name the Responses fields), sent to the engine (detached with `background`), and the answer's steps
    go back as the Responses events, or as the Response they end with; kept first when stored."""
    state: ServerState = server_state(request)
    gateway = state.gateway
    store = gateway.response_store
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
    # NOTE: engine request ids stay unique when two bodies name the same request_id.
    prepared = await state.preparer.prepare(chat, ids=(response_id, new_item_id(response_id)))
    response = ChatResponse(prepared, chat, state.llm.tokenizer, state.tool_call_parser, state.reasoning_parser)
    base = response_base(body, response_id, prepared.model, response.created, is_stored)
    events = ResponseEvents(base, response.num_tokens, response.content_logprobs)
    keep = keeper(store if is_stored else None, [*history, *body.input_items()])

    def generated() -> Awaitable[Outputs]:
        return state.admission.guarded(state.llm.generate(prepared.engine_requests, prepared.params), prepared)

    async def answer() -> dict[str, Any]:
        return await events.answer(response.steps(await generated()))

    if body.background:
        return JSONResponse(await gateway.background.start(base, keep, answer, state.admission))
    if body.stream:
        steps = response.steps(await generated())
        return sse_response(request, gateway, events.stream(steps, keep), response_id, is_named=True)
    whole = await unless_disconnected(request, answer())
    await keep(whole)
    return JSONResponse(whole)


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
    await gateway_of(request.app).background.stop(response_id)


def _store_or_404(request: Request, response_id: str) -> ResponseStore:
    store = gateway_of(request.app).response_store
    if store is None:
        error = _not_found(response_id)
        error.message += " This server keeps no responses (--responses-store off)."
        raise error
    return store


def _not_found(response_id: str, param: str | None = None) -> APIError:
    return APIError(f"Response with id {response_id!r} not found.", 404, param=param)
