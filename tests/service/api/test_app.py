"""The HTTP path end to end: a real gateway process, a real engine process, a tiny random model
(the routes' shapes and errors: the *_inproc.py tests, on a fake engine)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server_process import ServerProcess, running_server

COMPLETIONS = "/v1/completions"


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


def test_oversized_body_is_413_before_parsing(client: httpx.Client) -> None:
    # NOTE: over a real socket the 413 goes out before the 8 MiB upload is read; the client still
    # gets it, and the server serves on (in process, test_errors_inproc.py, the body is in memory).
    body = b'{"prompt": "' + b"x" * (8 * 2**20) + b'"}'
    response = client.post(COMPLETIONS, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    assert client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1}).status_code == 200


def test_without_restart_a_killed_engine_ends_the_stream_with_an_error_and_health_turns_503(
    tiny_model_dir: Path,
) -> None:
    with (
        running_server(tiny_model_dir, "--no-engine-restart") as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
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
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        # NOTE: the process's exit ends the stream, not a silence outlasting a heartbeat timeout (nor a
        # wait for a restart that will not come): the error says so, whatever the machine's speed.
        assert any('"error"' in line and "exited with code -9" in line for line in rest[-2:]), rest[-2:]
        assert client.get("/health").status_code == 503
        after = client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1})
        assert after.status_code == 503
        assert after.json()["error"]["code"] == "engine_dead"


def test_the_gateway_loads_the_grammar_library_at_its_first_constrained_request_not_at_start(
    tiny_model_dir: Path,
) -> None:
    def gateway_maps(server: ServerProcess) -> str:
        return Path(f"/proc/{server.proc.pid}/maps").read_text()

    bad_schema = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": 7}}}
    with running_server(tiny_model_dir) as server, httpx.Client(base_url=server.base_url, timeout=60) as client:
        assert client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        assert "xgrammar" not in gateway_maps(server) and "libtorch" not in gateway_maps(server)
        refused = client.post(COMPLETIONS, json={"prompt": "A number:", "response_format": bad_schema})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "response_format", refused.text
        assert "xgrammar" in gateway_maps(server)
        choice = {"prompt": "Yes or no?", "max_tokens": 8, "structured_outputs": {"choice": ["yes", "no"]}}
        answer = client.post(COMPLETIONS, json=choice)
        assert answer.status_code == 200 and answer.json()["choices"][0]["text"] in ("yes", "no"), answer.text
