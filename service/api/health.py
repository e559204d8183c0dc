"""Liveness: whether the gateway process answers at all, apart from whether an engine serves; and
one model's engines' readiness (a ping answered)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.gateway_state import ServerState

HEALTH_PING_TIMEOUT_S = 5.0


async def live(request: Request) -> Response:
    """200 while the process's event loop runs: loading, waiting for engines, serving or draining.

    NOTE: a Kubernetes liveness probe must not fail while a gateway waits for its engines, or the
    kubelet restarts a gateway that restarting cannot help; /health (readiness) says whether one serves.
    """
    return JSONResponse({"status": "alive"})


async def engine_health(state: ServerState) -> Response:
    """200 when the model's engines serve and answer a ping; else 503 saying why."""
    if state.engine_status != "ok":
        return JSONResponse({"status": state.engine_status}, status_code=503)
    try:
        async with asyncio.timeout(HEALTH_PING_TIMEOUT_S):
            await state.llm.engine_client.call_utility_async("ping")
    except TimeoutError:
        return JSONResponse({"status": "unresponsive"}, status_code=503)
    except Exception:  # noqa: BLE001 - any failure to answer is unhealthy
        return JSONResponse({"status": "dead" if state.llm.is_dead else "unhealthy"}, status_code=503)
    return JSONResponse({"status": "ok"})
