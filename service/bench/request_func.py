"""One streamed request to an OpenAI-compatible endpoint, timed chunk by chunk.

aiohttp (as vLLM's benchmark uses) with its C HTTP parser, and orjson: at hundreds of streams
the load generator shares the machine with the server, so its cost per event is kept small.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

_MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class RequestFuncInput:
    """What to send: the endpoint's URL, the full request body and its prompt length."""

    api_url: str
    body: dict[str, Any]
    prompt_len: int


@dataclass
class RequestFuncOutput:
    """What one streamed request measured (seconds); a failed one keeps its error text."""

    success: bool = False
    generated_text: str = ""
    prompt_len: int = 0
    output_tokens: int | None = None  # the server's usage.completion_tokens, when it sends usage
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    error: str = ""


def streaming_body(body: dict[str, Any], model: str, ignore_eos: bool) -> dict[str, Any]:
    """`body` as a greedy stream that reports usage at its end (the body's own fields win, not streaming's)."""
    streamed = {"model": model, "temperature": 0.0, **body, "stream": True, "stream_options": {"include_usage": True}}
    if ignore_eos:
        streamed["ignore_eos"] = True
    return streamed


async def request_openai_stream(session: aiohttp.ClientSession, request: RequestFuncInput) -> RequestFuncOutput:
    """Sends one streaming request; never raises: HTTP errors and broken streams come back as failures.

    TTFT is the time to the first chunk carrying text (a chat stream's opening role-only
    chunk does not count); ITL holds the gaps between later text chunks; latency runs to
    the end of the stream.
    """
    output = RequestFuncOutput(prompt_len=request.prompt_len)
    output.start_time = start = time.perf_counter()
    try:
        async with session.post(request.api_url, json=request.body) as response:
            if response.status != 200:
                text = (await response.read()).decode("utf-8", errors="replace")
                output.error = f"HTTP {response.status}: {text[:_MAX_ERROR_CHARS]}"
                return output
            is_done = await _read_stream(response, output, start)
    except Exception as exc:  # noqa: BLE001 - a request's failure is one of the results, never the run's end
        output.error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return output
    output.latency = time.perf_counter() - start
    if output.error:
        return output
    if not is_done:
        output.error = "the stream ended before data: [DONE]"
        return output
    if output.ttft == 0.0:
        output.ttft = output.latency  # NOTE: no visible text at all: the whole answer came at the end
    output.success = True
    return output


async def _read_stream(response: aiohttp.ClientResponse, output: RequestFuncOutput, start: float) -> bool:
    """Reads SSE `data:` events into `output`; True once `[DONE]` arrives."""
    last = start
    texts: list[str] = []
    try:
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            data = line[len(b"data:"):].strip()
            if data == b"[DONE]":
                return True
            if not data:
                continue
            chunk = orjson.loads(data)
            if not isinstance(chunk, dict):
                continue
            if "error" in chunk:
                output.error = f"error event: {orjson.dumps(chunk['error']).decode()[:_MAX_ERROR_CHARS]}"
                continue
            if usage := chunk.get("usage"):
                output.output_tokens = usage.get("completion_tokens", output.output_tokens)
            text = _chunk_text(chunk.get("choices"))
            if not text:
                continue
            now = time.perf_counter()
            if output.ttft == 0.0:
                output.ttft = now - start
            else:
                output.itl.append(now - last)
            last = now
            texts.append(text)
    finally:
        output.generated_text = "".join(texts)
    return False


def _chunk_text(choices: Any) -> str:
    """Text of a chunk's first choice: completions' `text` or chat's `delta.content` (or reasoning)."""
    if not choices or not isinstance(choices, list):
        return ""
    choice = choices[0]
    if isinstance(choice.get("text"), str):
        return str(choice["text"])
    delta = choice.get("delta") or {}
    return str(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or "")
