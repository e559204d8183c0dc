"""Resumable streams in process, on the fake engine: a kept stream read again from any event
(GET /v1/streams/{id}, or the same request re-sent with its X-Request-Id), its window, its memory
bound, and the errors of a stream that is not kept."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
import openai
import pytest

from service.api.gateway_state import gateway_of
from service.streams import stream_store
from service.streams.stream_store import StreamLog, StreamStore
from tests.service.api.fake_engine import FakeEngineClient

if TYPE_CHECKING:
    from tests.service.conftest import Serve

COMPLETIONS = "/v1/completions"
STREAMED = {"prompt": "Count:", "max_tokens": 12, "ignore_eos": True, "stream": True}


def frames(response: httpx.Response) -> list[str]:
    """The response's SSE events, each its `id:` line and its `data:` line."""
    assert response.status_code == 200, response.text
    return response.text.split("\n\n")[:-1]


async def until(condition: Callable[[], bool]) -> None:
    """Lets the event loop run until `condition()` holds, however many turns a busy machine takes."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0)


def response_id(events: list[str]) -> str:
    return str(json.loads(events[0].split("\ndata: ")[1])["id"])


async def test_a_kept_stream_is_read_again_from_any_event_without_generating_again(
    serve: Serve, engine: FakeEngineClient
) -> None:
    async with serve(stream_retention_s=30.0) as client:
        first = await client.post(COMPLETIONS, json=STREAMED, headers={"X-Request-Id": "mine-1"})
        events = frames(first)
        assert first.headers["x-request-id"] == "mine-1"
        assert events[-1] == f"id: {len(events) - 1}\ndata: [DONE]"
        # NOTE: by its X-Request-Id or by the response's id, after the event it names.
        for stream_id in ("mine-1", response_id(events)):
            again = await client.get(f"/v1/streams/{stream_id}", headers={"Last-Event-ID": "3"})
            assert frames(again) == events[4:]
        assert frames(await client.get("/v1/streams/mine-1")) == events
        resent = await client.post(COMPLETIONS, json=STREAMED, headers={"X-Request-Id": "mine-1", "Last-Event-ID": "9"})
        assert frames(resent) == events[10:]
        assert len(engine.requests) == 1
        # NOTE: a new X-Request-Id is a new request.
        other = await client.post(COMPLETIONS, json=STREAMED, headers={"X-Request-Id": "mine-2"})
        assert len(frames(other)) == len(events) and len(engine.requests) == 2
        # NOTE: an id may hold a slash; the route takes the rest of the path.
        slashed = await client.post(COMPLETIONS, json=STREAMED, headers={"X-Request-Id": "team/7"})
        assert frames(await client.get("/v1/streams/team/7")) == frames(slashed)


def store_of(client: httpx.AsyncClient) -> StreamStore:
    store: StreamStore = gateway_of(client._transport.app).streams  # type: ignore[attr-defined]
    return store


async def started_and_left(client: httpx.AsyncClient, stream_id: str, max_tokens: int) -> StreamLog:
    """A kept stream whose client went away once it had started."""
    streams = store_of(client)
    response = asyncio.create_task(client.post(COMPLETIONS, json={**STREAMED, "max_tokens": max_tokens},
                                               headers={"X-Request-Id": stream_id}))
    while (log := streams.get(stream_id)) is None:
        assert not response.done(), response.result()
        await asyncio.sleep(0.01)
    response.cancel()
    return log


async def test_a_stream_nobody_reads_generates_to_its_end_and_waits_for_its_client(
    serve: Serve, engine: FakeEngineClient
) -> None:
    engine.seconds_per_step = 0.01
    async with serve(stream_retention_s=30.0) as client:
        log = await started_and_left(client, "gone", 40)
        while not log.is_finished:
            await asyncio.sleep(0.01)
        assert engine.aborted_ids == []
        assert frames(await client.get("/v1/streams/gone"))[-1].endswith("data: [DONE]")


async def test_a_finished_stream_is_kept_for_the_window_only(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: the window on a clock the test moves: kept however long this busy machine takes to read it.
    now = [0.0]
    monkeypatch.setattr(stream_store, "clock", lambda: now[0])
    async with serve(stream_retention_s=30.0) as client:
        events = frames(await client.post(COMPLETIONS, json=STREAMED, headers={"X-Request-Id": "brief"}))
        assert frames(await client.get("/v1/streams/brief")) == events
        now[0] += 30.0
        deadline = time.monotonic() + 60
        while (gone := await client.get("/v1/streams/brief")).status_code == 200:
            assert time.monotonic() < deadline, "the stream outlived its window"
            await asyncio.sleep(0.1)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "stream_not_found"


async def test_streams_not_kept_or_unknown_or_a_bad_last_event_id_are_clear_errors(
    serve: Serve, api: httpx.AsyncClient
) -> None:
    off = await api.get("/v1/streams/anything")
    assert off.status_code == 404 and "--stream-retention" in off.json()["error"]["message"]
    echoed = await api.post(COMPLETIONS, json=STREAMED, headers={"X-Request-Id": "not-kept"})
    assert echoed.headers["x-request-id"] == "not-kept"
    assert (await api.get("/v1/streams/not-kept")).status_code == 404
    async with serve(stream_retention_s=30.0) as client:
        unknown = await client.get("/v1/streams/never-started")
        assert unknown.status_code == 404 and "never-started" in unknown.json()["error"]["message"]
        await client.post(COMPLETIONS, json=STREAMED, headers={"X-Request-Id": "kept"})
        # NOTE: "\u00b2" (superscript two) is a digit to Python's str.isdigit but no event id.
        for value in ("seven", "-1", "\u00b2"):
            bad = await client.get("/v1/streams/kept", headers={"Last-Event-ID": value.encode("latin-1")})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID", value


async def test_a_stream_no_client_comes_back_to_is_aborted_after_the_window(
    serve: Serve, engine: FakeEngineClient
) -> None:
    engine.seconds_per_step = 0.01
    async with serve(stream_retention_s=0.3) as client:
        await started_and_left(client, "abandoned", 2000)
        streams = store_of(client)
        deadline = time.monotonic() + 60
        while not engine.aborted_ids:
            assert time.monotonic() < deadline, "the abandoned request kept generating"
            await asyncio.sleep(0.05)
        assert streams.get("abandoned") is None
        assert engine.aborted_ids == [engine.requests[0].request_id]


async def test_deleting_a_kept_stream_aborts_its_request_at_once(serve: Serve, engine: FakeEngineClient) -> None:
    engine.seconds_per_step = 0.01
    async with serve(stream_retention_s=60.0) as client:
        await started_and_left(client, "team/left", 2000)
        deleted = await client.delete("/v1/streams/team/left")
        assert deleted.status_code == 200 and deleted.json() == {"id": "team/left", "object": "stream", "deleted": True}
        deadline = time.monotonic() + 60
        while not engine.aborted_ids:
            assert time.monotonic() < deadline, "the deleted stream's request kept generating"
            await asyncio.sleep(0.02)
        assert engine.aborted_ids == [engine.requests[0].request_id]
        assert (await client.get("/v1/streams/team/left")).status_code == 404
        again = await client.delete("/v1/streams/team/left")
        assert again.status_code == 404 and again.json()["error"]["code"] == "stream_not_found"


async def test_keepalive_comments_between_numbered_events_do_not_trip_the_openai_sdk(
    serve: Serve, engine: FakeEngineClient
) -> None:
    engine.seconds_per_step = 0.03
    async with serve(sse_keepalive_s=0.01) as client:
        raw = await client.post(COMPLETIONS, json={**STREAMED, "max_tokens": 10})
        assert "\n: ping\n" in raw.text and "\n: ping\n\n" not in raw.text
        sdk = openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=client, max_retries=0)
        stream = await sdk.completions.create(
            model="fake", prompt="Count:", max_tokens=10, stream=True, extra_body={"ignore_eos": True}
        )
        assert "".join([chunk.choices[0].text async for chunk in stream if chunk.choices]) == engine.output_text(10)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": 3, "store": False}),
])
async def test_every_generation_route_is_in_flight_until_its_kept_stream_ends(
    serve: Serve, path: str, body: dict[str, object]
) -> None:
    """A drain waits for each route's requests, and a kept stream gives back the one slot it took."""
    async with serve(stream_retention_s=30.0) as client:
        admission = gateway_of(client._transport.app).admission  # type: ignore[attr-defined]
        acquire, num_acquired = admission.acquire, []

        def counted_acquire() -> None:
            num_acquired.append(1)
            acquire()

        admission.acquire = counted_acquire
        sent = {"model": "fake", "stream": True, **body}
        first = await client.post(path, json=sent, headers={"x-request-id": f"kept{path}"})
        assert first.status_code == 200, first.text
        await until(lambda: admission.num_in_flight == 0)
        resumed = await client.post(path, json=sent, headers={"x-request-id": f"kept{path}"})
        assert resumed.text == first.text
        assert len(num_acquired) == 2 and admission.num_in_flight == 0
