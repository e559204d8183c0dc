"""Reads an SSE response the way an OpenAI client does: `data:` lines until [DONE]."""

from __future__ import annotations

import json
from typing import Any

import httpx


def stream_events(client: httpx.Client, path: str, body: dict[str, Any]) -> list[Any]:
    """POSTs `body` and returns the decoded `data:` payloads, "[DONE]" kept as a string."""
    events: list[Any] = []
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events
