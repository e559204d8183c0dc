"""Server-sent events: OpenAI chunk objects, an error event on failure, then [DONE]."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse

from service.api.errors import APIError

logger = logging.getLogger(__name__)


async def _events(chunks: AsyncIterator[dict[str, Any]]) -> AsyncIterator[str]:
    try:
        async for chunk in chunks:
            yield json.dumps(chunk, separators=(",", ":"), ensure_ascii=False)
    except APIError as error:
        yield json.dumps(error.to_dict())
    except Exception as error:  # noqa: BLE001 - a stream must end with an error, never hang
        logger.warning("stream ended by error: %s", error)
        yield json.dumps(APIError(str(error), 503, error_type="server_error").to_dict())
    yield "[DONE]"


def sse_response(chunks: AsyncIterator[dict[str, Any]]) -> EventSourceResponse:
    """Streams `chunks` as `data:` events, ending with `data: [DONE]`."""
    return EventSourceResponse(_events(chunks), sep="\n")
