"""Resumable streams through a real `zeroserve serve --stream-retention` (tiny random model): a
client that drops its connection mid-stream and comes back with Last-Event-ID, at
GET /v1/streams/{id} or by re-sending its request with the same X-Request-Id, reads exactly what
it missed: its concatenated text is the undisturbed text."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, running_server

CHAT = "/v1/chat/completions"
BODY = {
    "messages": [{"role": "user", "content": "Tell me a long story about a fox who learns to sail."}],
    "max_tokens": 160, "temperature": 0, "ignore_eos": True, "stream": True,
}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with running_server(tiny_model_dir, "--served-model-name", "tiny", "--stream-retention", "30") as server:
        yield server


def read_events(lines: Iterator[str], num_events: int | None = None) -> list[tuple[int, str]]:
    """(id, data) of the next `num_events` events (all of them when None)."""
    events: list[tuple[int, str]] = []
    event_id = None
    for line in lines:
        if line.startswith("id: "):
            event_id = int(line[4:])
        elif line.startswith("data: "):
            assert event_id is not None, "an event without its id"
            events.append((event_id, line[6:]))
            event_id = None
            if num_events is not None and len(events) == num_events:
                break
    return events


def text_of(events: list[tuple[int, str]]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for _, data in events if data != "[DONE]"
        for choice in json.loads(data)["choices"]
    )


def dropped_after(client: httpx.Client, num_events: int, headers: dict[str, str] | None = None) -> list[tuple[int, str]]:
    """The first `num_events` events of a stream whose client then closes its connection."""
    with client.stream("POST", CHAT, json=BODY, headers=headers) as response:
        assert response.status_code == 200
        return read_events(response.iter_lines(), num_events)


def test_a_dropped_stream_resumes_with_last_event_id_at_its_url(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", CHAT, json=BODY) as response:
            undisturbed = read_events(response.iter_lines())
        assert undisturbed[-1][1] == "[DONE]" and [i for i, _ in undisturbed] == list(range(len(undisturbed)))
        first = dropped_after(client, 5)
        stream_id = json.loads(first[0][1])["id"]
        resumed = client.get(f"/v1/streams/{stream_id}", headers={"Last-Event-ID": str(first[-1][0])})
        rest = read_events(iter(resumed.text.splitlines()))
    assert rest[0][0] == first[-1][0] + 1 and rest[-1][1] == "[DONE]"
    assert text_of(first + rest) == text_of(undisturbed)
    assert len(text_of(undisturbed)) > 100


def test_a_dropped_stream_resumes_by_resending_the_request_with_its_x_request_id(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", CHAT, json=BODY) as response:
            undisturbed = read_events(response.iter_lines())
        first = dropped_after(client, 7, headers={"X-Request-Id": "story-1"})
        with client.stream(
            "POST", CHAT, json=BODY, headers={"X-Request-Id": "story-1", "Last-Event-ID": str(first[-1][0])}
        ) as response:
            assert response.headers["x-request-id"] == "story-1"
            rest = read_events(response.iter_lines())
    assert text_of(first + rest) == text_of(undisturbed)
    assert [i for i, _ in first + rest] == list(range(len(first) + len(rest)))
