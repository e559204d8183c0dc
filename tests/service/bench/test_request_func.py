"""One streamed request against scripted replies from a real HTTP server on loopback: timings,
usage, and every way it can fail."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from service.bench.request_func import RequestFuncInput, RequestFuncOutput, request_openai_stream, streaming_body

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(
        f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode() for event in events
    )


def reply(body: bytes, status: int = 200, content_type: str = "text/event-stream") -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, body=body, content_type=content_type)

    return handler


async def send(handler: Handler) -> RequestFuncOutput:
    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        request = RequestFuncInput(
            f"http://127.0.0.1:{port}/v1/completions", {"prompt": "hi", "max_tokens": 3}, prompt_len=7
        )
        async with aiohttp.ClientSession() as session:
            return await request_openai_stream(session, request)
    finally:
        await runner.cleanup()


def text_chunk(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}]}


async def test_a_completed_stream_yields_text_timings_and_usage() -> None:
    body = sse(
        text_chunk("a"), text_chunk("b"), text_chunk("c"),
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}, "[DONE]",
    )
    output = await send(reply(body))
    assert output.success and output.error == ""
    assert output.generated_text == "abc"
    assert (output.output_tokens, output.prompt_len) == (3, 7)
    assert len(output.itl) == 2
    assert 0 < output.ttft <= output.latency


async def test_a_chat_streams_opening_role_chunk_is_not_the_first_token() -> None:
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    content = {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}
    output = await send(reply(sse(role, content, content, "[DONE]")))
    assert output.success and output.generated_text == "HiHi"
    assert len(output.itl) == 1 and output.output_tokens is None


async def test_http_errors_fail_with_status_and_body() -> None:
    body = json.dumps({"error": {"message": "bad max_tokens"}}).encode()
    output = await send(reply(body, status=400, content_type="application/json"))
    assert not output.success
    assert output.error.startswith("HTTP 400:") and "bad max_tokens" in output.error


async def test_a_stream_cut_before_done_fails() -> None:
    output = await send(reply(sse(text_chunk("a"))))
    assert not output.success and "[DONE]" in output.error


async def test_an_error_event_in_the_stream_fails() -> None:
    error = {"error": {"message": "engine died", "code": 503}}
    output = await send(reply(sse(text_chunk("a"), error, "[DONE]")))
    assert not output.success and "engine died" in output.error


async def test_a_connection_dropped_mid_stream_fails_without_raising() -> None:
    async def broken(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(sse(text_chunk("a")))
        assert request.transport is not None
        request.transport.close()
        return response

    output = await send(broken)
    assert not output.success and output.generated_text == "a"
    assert output.error.startswith("ClientPayloadError")


async def test_unparsable_data_fails() -> None:
    output = await send(reply(b"data: {not json\n\n"))
    assert not output.success and output.error.startswith("JSONDecodeError")


def test_streaming_body_asks_for_usage_and_keeps_the_bodys_own_fields() -> None:
    body = streaming_body({"prompt": "x", "temperature": 0.7, "stream": False}, "m", ignore_eos=True)
    assert body == {
        "model": "m", "prompt": "x", "temperature": 0.7, "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": True,
    }
    assert "ignore_eos" not in streaming_body({"prompt": "x"}, "m", ignore_eos=False)


async def test_malformed_chunks_fail_without_raising() -> None:
    output = await send(reply(b"data:\n\n" + sse({"choices": ["not an object"]}, "[DONE]")))
    assert not output.success and output.error.startswith("AttributeError")
