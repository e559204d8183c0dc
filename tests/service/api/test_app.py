"""The HTTP path end to end: a real gateway process, a real engine process, a tiny random model."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess, running_server
from tests.service.api.sse_client import stream_events

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        yield client


def test_health_and_models(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny", "tiny-alias"]


def test_chat_stream_is_openai_chunks_then_done(client: httpx.Client) -> None:
    body = {"model": "tiny", "messages": MESSAGES, "stream": True, "max_tokens": 12,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    events = stream_events(client, CHAT, body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finals] == ["length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text  # random weights, but some text came out


def test_streamed_text_equals_non_streamed_text(client: httpx.Client) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 10, "temperature": 0, "ignore_eos": True}
    whole = client.post(COMPLETIONS, json=body).json()
    assert whole["object"] == "text_completion"
    assert whole["usage"]["completion_tokens"] == 10
    events = stream_events(client, COMPLETIONS, {**body, "stream": True})
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert streamed == whole["choices"][0]["text"]


def test_chat_non_streamed_has_message_and_usage(client: httpx.Client) -> None:
    response = client.post(CHAT, json={"model": "tiny-alias", "messages": MESSAGES, "max_tokens": 5,
                                       "ignore_eos": True})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion" and body["model"] == "tiny-alias"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 5


def test_concurrent_greedy_requests_match_their_solo_runs(client: httpx.Client, server: ServerProcess) -> None:
    import concurrent.futures

    prompts = [f"Story number {i}: once upon a time" * (i + 1) for i in range(6)]

    def complete(prompt: str) -> str:
        with httpx.Client(base_url=server.base_url, timeout=60) as c:
            body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
            return str(c.post(COMPLETIONS, json=body).json()["choices"][0]["text"])

    solo = [complete(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(complete, prompts))
    assert together == solo


BAD_REQUESTS: list[tuple[str, Any, int, str | None]] = [
    (CHAT, b"{not json", 400, None),
    (CHAT, b"[1, 2]", 400, None),
    (CHAT, {"model": "tiny"}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    (CHAT, {"model": "nope", "messages": MESSAGES}, 404, "model"),
    (CHAT, {"messages": MESSAGES, "temperature": -1}, 400, "temperature"),
    (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "temperature"),
    (CHAT, {"messages": MESSAGES, "temperature": "hot"}, 400, "temperature"),
    (CHAT, {"messages": MESSAGES, "top_p": 0}, 400, "top_p"),
    (CHAT, {"messages": MESSAGES, "top_p": 1.5}, 400, "top_p"),
    (CHAT, {"messages": MESSAGES, "top_k": -2}, 400, "top_k"),
    (CHAT, {"messages": MESSAGES, "min_p": 2}, 400, "min_p"),
    (CHAT, {"messages": MESSAGES, "presence_penalty": 3}, 400, "presence_penalty"),
    (CHAT, {"messages": MESSAGES, "frequency_penalty": -3}, 400, "frequency_penalty"),
    (CHAT, {"messages": MESSAGES, "repetition_penalty": 0}, 400, "repetition_penalty"),
    (CHAT, {"messages": MESSAGES, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    (CHAT, {"messages": MESSAGES, "logit_bias": {"5": 200}}, 400, "logit_bias"),
    (CHAT, {"messages": MESSAGES, "logit_bias": {"99999999": 1}}, 400, "logit_bias"),
    (CHAT, {"messages": MESSAGES, "seed": 2**70}, 400, "seed"),
    (CHAT, {"messages": MESSAGES, "n": 0}, 400, "n"),
    (CHAT, {"messages": MESSAGES, "n": 17}, 400, "n"),
    (CHAT, {"messages": MESSAGES, "best_of": 2}, 400, "best_of"),
    (CHAT, {"messages": MESSAGES, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {"messages": MESSAGES, "max_tokens": 100_000}, 400, "max_tokens"),
    (CHAT, {"messages": MESSAGES, "min_tokens": -1}, 400, "min_tokens"),
    (CHAT, {"messages": MESSAGES, "stop": 5}, 400, "stop"),
    (CHAT, {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    (CHAT, {"messages": MESSAGES, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": MESSAGES, "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    (CHAT, {"messages": MESSAGES, "stream_options": {"include_usage": "maybe"}}, 400,
     "stream_options.include_usage"),
    (CHAT, {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "required"}, 400, "tool_choice"),
    (CHAT, {"messages": MESSAGES, "response_format": {"type": "json_schema"}}, 400, "response_format"),
    (CHAT, {"messages": MESSAGES, "continue_final_message": True}, 400, "continue_final_message"),
    (COMPLETIONS, {"max_tokens": 3}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ["ok", ""]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 3000}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "suffix": "x"}, 400, "suffix"),
    (COMPLETIONS, {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 30}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": "hi", "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    ("/tokenize", {}, 400, "prompt"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    client: httpx.Client, path: str, body: Any, status: int, param: str | None
) -> None:
    if isinstance(body, bytes):
        response = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert error["param"] == param
    ok = client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200


def test_oversized_body_is_413_before_parsing(client: httpx.Client) -> None:
    body = b'{"prompt": "' + b"x" * (8 * 2**20) + b'"}'
    response = client.post(COMPLETIONS, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1}).status_code == 200


def test_unknown_route_is_an_openai_404(client: httpx.Client) -> None:
    response = client.get("/v1/nothing-here")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found_error"


def test_killed_engine_ends_the_stream_with_an_error_and_health_turns_503(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        (engine_pid,) = server.engine_pids()
        body = {"prompt": "Count forever:", "max_tokens": 1500, "ignore_eos": True, "stream": True}
        events: list[str] = []
        with client.stream("POST", COMPLETIONS, json=body) as response:
            lines = response.iter_lines()
            while len(events) < 3:
                line = next(lines)
                if line.startswith("data: "):
                    events.append(line)
            import os

            os.kill(engine_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            rest = [line for line in lines if line.startswith("data: ")]
            ended_after = time.monotonic() - killed_at
        assert ended_after < 2.0
        assert rest[-1] == "data: [DONE]"
        assert any('"error"' in line for line in rest[-2:])
        assert client.get("/health").status_code == 503
        after = client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1})
        assert after.status_code == 503
        assert after.json()["error"]["code"] == "engine_dead"
