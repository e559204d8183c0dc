"""The Files and Batch APIs as a test client uses them: a batch line, an upload, a batch created, polled
until it gets somewhere, and a file's lines read back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

CHAT = "/v1/chat/completions"
# NOTE: polls of a batch before a test gives up on it (the fake engine needs a few; this only ends a hang).
MAX_POLLS = 5000


def chat_line(custom_id: str, max_tokens: int = 3, url: str = CHAT, method: str = "POST") -> str:
    body = {"messages": [{"role": "user", "content": f"Hi {custom_id}"}], "max_tokens": max_tokens,
            "ignore_eos": True}
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


async def upload(client: httpx.AsyncClient, lines: list[str], purpose: str = "batch") -> dict[str, Any]:
    content = "".join(line + "\n" for line in lines).encode()
    response = await client.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": purpose})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def create_batch(client: httpx.AsyncClient, file_id: str, **changes: Any) -> httpx.Response:
    body = {"input_file_id": file_id, "endpoint": CHAT, "completion_window": "24h", **changes}
    return await client.post("/v1/batches", json=body)


async def until_status(client: httpx.AsyncClient, batch_id: str, statuses: set[str]) -> dict[str, Any]:
    """The batch once its status is one of `statuses` (the fake engine answers within a few polls)."""
    for _ in range(MAX_POLLS):
        batch = (await client.get(f"/v1/batches/{batch_id}")).json()
        if batch["status"] in statuses:
            return dict(batch)
        await asyncio.sleep(0.02)
    raise AssertionError(f"the batch never got to {statuses}: {batch}")


async def file_lines(client: httpx.AsyncClient, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    response = await client.get(f"/v1/files/{file_id}/content")
    assert response.status_code == 200
    return [json.loads(line) for line in response.text.splitlines()]
