"""Liveness: whether the gateway process answers at all, apart from whether an engine serves."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response


async def live(request: Request) -> Response:
    """200 while the process's event loop runs: loading, waiting for engines, serving or draining.

    NOTE: a Kubernetes liveness probe must not fail while a gateway waits for its engines, or the
    kubelet restarts a gateway that restarting cannot help; /health (readiness) says whether one serves.
    """
    return JSONResponse({"status": "alive"})
