"""A multi-model gateway's model routes: GET /v1/models with each model's status, POST
/v1/models/{id}/load and /unload (and llama.cpp's router's POST /models/load and /models/unload),
and GET /health/{id}, one model's readiness."""

from __future__ import annotations

import asyncio

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.errors import check_content_type, read_body
from service.api.gateway_state import ServerPool, ServerSlot, gateway_of
from service.api.health import engine_health
from service.models.model_pool import ModelStatus
from service.openai.errors import APIError
from service.openai.response_bodies import now

# vLLM's ModelPermission, as its /v1/models lists it.
MODEL_PERMISSION = {
    "object": "model_permission", "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False, "organization": "*",
    "group": None, "is_blocking": False,
}


def model_card(name: str, root: str, max_model_len: int | None, created: int) -> dict[str, object]:
    """One model as vLLM's /v1/models lists it."""
    return {
        "id": name, "object": "model", "created": created, "owned_by": "zeroserve", "root": root, "parent": None,
        "max_model_len": max_model_len,
        "permission": [MODEL_PERMISSION | {"id": f"modelperm-{name}", "created": created}],
    }


def pool_model_cards(pool: ServerPool) -> list[dict[str, object]]:
    """Every model and alias of the pool, each with its status (llama.cpp's router's `status.value`)."""
    created = now()
    return [_card(slot, name, created) for slot in pool.slots.values() for name in slot.entry.names]


def _card(slot: ServerSlot, name: str, created: int) -> dict[str, object]:
    max_model_len = None if slot.state is None else slot.state.llm.ready.max_model_len
    # NOTE: the file's name, not where it lies: the card is for whoever lists the models.
    file_name = None if slot.entry.path is None else slot.entry.path.name
    return model_card(name, slot.id, max_model_len, created) | {"path": file_name, "status": slot.describe()}


def _pool(request: Request) -> ServerPool:
    pool = gateway_of(request.app).pool
    if pool is None:
        raise APIError(
            "This server serves one model; start it with several (zeroserve serve A B, --models-dir) to load and "
            "unload models.", 400,
        )
    return pool


async def load_model(request: Request) -> Response:
    """Loads the model (again, if it failed) and answers once it is loaded or has failed."""
    pool = _pool(request)
    slot = pool.slot_of(await _model_of(request))
    load = pool.start_loading(slot, is_retry=True)
    if load is not None:
        await asyncio.shield(load)
    return _slot_answer(slot)


async def unload_model(request: Request) -> Response:
    """Unloads the model now, aborting what it still runs."""
    pool = _pool(request)
    slot = await pool.unload(await _model_of(request))
    return _slot_answer(slot)


def _slot_answer(slot: ServerSlot) -> Response:
    card = _card(slot, slot.id, now())
    return JSONResponse({"success": slot.status is not ModelStatus.FAILED, **card})


async def _model_of(request: Request) -> str:
    """The model the path names, or llama.cpp's body {"model": ...}."""
    if "model_id" in request.path_params:
        return str(request.path_params["model_id"])
    check_content_type(request.headers.get("content-type"))
    try:
        body = orjson.loads(await read_body(request, 2**16) or b"{}")
    except orjson.JSONDecodeError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise APIError('The body must be a JSON object naming the model: {"model": "..."}.', 400, param="model")
    return str(body["model"])


async def pool_health(pool: ServerPool) -> Response:
    """200 while some model can serve (loaded and answering, or loadable); each model's status beside."""
    statuses = {slot.id: slot.status.value for slot in pool.slots.values()}
    is_ready = any(status in (ModelStatus.LOADED, ModelStatus.LOADING, ModelStatus.UNLOADED) for status in
                   (slot.status for slot in pool.slots.values()))
    body = {"status": "ok" if is_ready else "no_model_can_serve", "models": statuses}
    return JSONResponse(body, status_code=200 if is_ready else 503)


async def model_health(request: Request) -> Response:
    """200 when the model is loaded and its engine answers a ping; else 503 with its status, and why it
    failed to a caller with the API key (or on a keyless server: a reason can name paths)."""
    pool = _pool(request)
    slot = pool.slot_of(str(request.path_params["model_id"]))
    state = slot.state
    if state is None or slot.status is not ModelStatus.LOADED:
        shows_reason = bool(slot.error) and getattr(request.state, "has_api_key", True)
        return JSONResponse({"status": slot.status.value, **({"reason": slot.error} if shows_reason else {})}, 503)
    return await engine_health(state)
