"""What operators rely on, against real gateway and engine processes on the tiny model: health
while loading and after the engine dies, API keys, 429 past the queue cap, request timeouts,
the SIGTERM drain, Ctrl-C to the whole process group, SIGKILL, and SSE keepalive comments."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
import torch

from tests.server_process import ServerProcess, free_port, running_server

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
AUTH = {"Authorization": "Bearer k1"}
LONG_STREAM = {"prompt": "Count:", "max_tokens": 1500, "ignore_eos": True, "stream": True}


def wait_for(condition: Callable[[], bool], timeout_s: float = 120.0) -> None:
    """Returns once `condition()` holds; `timeout_s` only bounds a wait that would never end (generous:
    a busy machine may take many times as long as a quiet one)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def data_events(lines: Iterator[str]) -> list[Any]:
    """The rest of a stream's `data:` payloads, decoded ("[DONE]" kept as a string)."""
    import json

    events: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def first_data_line(lines: Iterator[str]) -> str:
    return next(line for line in lines if line.startswith("data: "))


def finish_reasons(events: list[Any]) -> dict[int, str]:
    return {
        choice["index"]: choice["finish_reason"]
        for event in events if isinstance(event, dict) and "choices" in event
        for choice in event["choices"] if choice["finish_reason"] is not None
    }


def test_health_is_503_while_loading_then_200_and_recovering_while_a_killed_engine_restarts(
    tiny_model_dir: Path,
) -> None:
    with (
        running_server(tiny_model_dir, wait_healthy=False) as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        loading = client.get("/health")
        refused = client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1})
        assert (loading.status_code, loading.json()) == (503, {"status": "loading"})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "model_loading"
        wait_for(lambda: client.get("/health").status_code == 200)
        version = client.get("/version").json()
        assert version["version"] == importlib.metadata.version("zeroserve")
        # NOTE: the machine and what the engine chose to run on it, as its startup log names them.
        assert torch.backends.cpu.get_cpu_capability() in version["cpu"]
        assert {"linears", "head", "attention"} <= version["kernels"].keys()
        (engine_pid,) = server.engine_pids()
        os.kill(engine_pid, signal.SIGKILL)
        statuses: list[str] = []

        def is_back() -> bool:
            health = client.get("/health")
            statuses.append(health.json()["status"])
            return health.status_code == 200 and "recovering" in statuses

        wait_for(is_back)
        assert server.engine_pids() != [engine_pid]
        assert client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}).json()["usage"]["completion_tokens"] == 2


def test_a_model_that_cannot_load_ends_the_server_with_status_2(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "service", "serve", str(tmp_path / "missing.gguf"), "--port", str(free_port())]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "missing.gguf" in result.stderr.splitlines()[-1]


def test_sigkill_of_the_gateway_leaves_no_engine_process(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir) as server:
        (engine_pid,) = server.engine_pids()
        server.proc.kill()
        server.proc.wait()
        wait_for(lambda: is_gone(engine_pid))


def test_sigterm_drains_finishes_short_streams_aborts_long_ones_and_exits_0(tiny_model_dir: Path) -> None:
    with (
        running_server(tiny_model_dir, "--shutdown-timeout", "2") as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        (engine_pid,) = server.engine_pids()
        # NOTE: 2000 steps take well over 2 s in this engine; 100 take a fraction of a second. The
        # short stream starts last, so it is still running when the signal lands; its first event is
        # kept, since a fast engine may have finished it inside that one event.
        short_body = {**LONG_STREAM, "max_tokens": 100}
        with (
            client.stream("POST", COMPLETIONS, json={**LONG_STREAM, "max_tokens": 2000}) as long,
            client.stream("POST", COMPLETIONS, json=short_body) as short,
        ):
            long_lines = long.iter_lines()
            first_data_line(long_lines)
            short_lines = short.iter_lines()
            short_first = first_data_line(short_lines)
            server.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: client.get("/health").status_code == 503)
            assert client.get("/health").json() == {"status": "draining"}
            refused = client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1})
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "server_shutting_down"
            with ThreadPoolExecutor(2) as pool:
                short_events, long_events = pool.map(data_events, [short_lines, long_lines])
        short_events = data_events(iter([short_first])) + short_events
        assert short_events[-1] == "[DONE]"
        assert finish_reasons(short_events) == {0: "length"}
        assert not any("error" in event for event in short_events[:-1])
        assert finish_reasons(long_events) == {0: "abort"}
        assert long_events[-2]["error"]["code"] == "server_shutting_down"
        assert long_events[-1] == "[DONE]"
        assert server.proc.wait(20) == 0
        assert is_gone(engine_pid)
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{server.base_url}/health")


@pytest.mark.parametrize("num_api_servers", ["1", "2"])
def test_ctrl_c_to_the_whole_process_group_drains_every_stream_and_exits_0(
    tiny_model_dir: Path, num_api_servers: str, tmp_path: Path
) -> None:
    # NOTE: a terminal's Ctrl-C signals every process in its foreground group; the server was
    # started as the leader of a group of its own, as a shell starts `make serve`.
    log = tmp_path / "server.log"
    with (
        running_server(tiny_model_dir, "--api-server-count", num_api_servers, log_file=log) as server,
        httpx.Client(base_url=server.base_url, timeout=60) as client,
        ExitStack() as streams,
    ):
        assert os.getpgid(server.proc.pid) == server.proc.pid
        processes = psutil.Process(server.proc.pid).children(recursive=True)
        assert len(processes) == 1 + 2 * (num_api_servers == "2")
        body = {**LONG_STREAM, "max_tokens": 800}
        lines = [streams.enter_context(client.stream("POST", COMPLETIONS, json=body)).iter_lines() for _ in range(4)]
        for stream_lines in lines:
            first_data_line(stream_lines)
        os.killpg(server.proc.pid, signal.SIGINT)
        wait_for(lambda: client.get("/health").status_code == 503)
        with ThreadPoolExecutor(4) as pool:
            events = list(pool.map(data_events, lines))
        for stream_events in events:
            assert stream_events[-1] == "[DONE]"
            assert not any("error" in event for event in stream_events[:-1])
            assert finish_reasons(stream_events) == {0: "length"}
        assert server.proc.wait(30) == 0
        wait_for(lambda: all(is_gone(process.pid) for process in processes))
    lines = log.read_text().splitlines()
    assert any(line.endswith("SIGINT: shutting down") for line in lines), lines[-10:]
    assert lines[-1].endswith("stopped"), lines[-10:]


def test_a_stream_the_client_dropped_gets_its_request_log_line_and_metric(tiny_model_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with running_server(tiny_model_dir, log_file=log) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        with client.stream("POST", COMPLETIONS, json={**LONG_STREAM, "max_tokens": 2000}) as dropped:
            request_id = json.loads(first_data_line(dropped.iter_lines())[len("data: "):])["id"]
        wait_for(lambda: f"request {request_id}" in log.read_text())
        line = next(line for line in log.read_text().splitlines() if f"request {request_id}" in line)
        assert "finished (abort)" in line, line
        metrics = client.get("/metrics").text
        assert re.search(r'request_success_total{[^}]*finished_reason="abort"[^}]*} 1.0', metrics), metrics


def test_a_second_sigterm_aborts_the_drain_at_once(tiny_model_dir: Path) -> None:
    with (
        running_server(tiny_model_dir, "--shutdown-timeout", "120") as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
        client.stream("POST", COMPLETIONS, json={**LONG_STREAM, "max_tokens": 2000}) as long,
    ):
        lines = long.iter_lines()
        first_data_line(lines)
        server.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: client.get("/health").status_code == 503)
        server.proc.send_signal(signal.SIGTERM)
        events = data_events(lines)
        assert finish_reasons(events) == {0: "abort"}
        assert server.proc.wait(20) == 0


def test_request_timeout_aborts_and_reports_it(tiny_model_dir: Path) -> None:
    # NOTE: --request-timeout reaching a real server (2000 tokens take this engine well over 1 s); the
    # 408's code and headers, and streams ending in an error event: test_app_inproc.py.
    with (
        running_server(tiny_model_dir, "--request-timeout", "1") as server,
        httpx.Client(base_url=server.base_url, timeout=30) as client,
    ):
        response = client.post(COMPLETIONS, json={"prompt": "Count:", "max_tokens": 2000, "ignore_eos": True})
        assert response.status_code == 408


@pytest.fixture(scope="module")
def ops_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    """One request runs at a time, two more may wait; keys k1 and k2; a keepalive every 0.2 s."""
    args = ["--served-model-name", "tiny", "--api-key", "k1", "--api-key", "k2", "--max-num-seqs", "1",
            "--max-num-queued-requests", "2", "--sse-keepalive", "0.2"]
    with running_server(tiny_model_dir, *args) as server:
        yield server


@pytest.fixture
def ops_client(ops_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=ops_server.base_url, headers=AUTH, timeout=30) as client:
        yield client
        # NOTE: the next test may need every slot; streams closed here free theirs a moment later.
        wait_for(lambda: client.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1}).status_code == 200)


def test_api_keys_guard_every_route_but_health(ops_server: ServerProcess) -> None:
    # NOTE: --api-key reaching a real server, the SDK's key, and a big head through hypercorn; which
    # routes are guarded, and the 401's shape: test_app_inproc.py.
    with httpx.Client(base_url=ops_server.base_url, timeout=30) as client:
        assert client.get("/v1/models", headers={"Authorization": "Bearer k2"}).status_code == 200
        too_large = client.get("/health", headers={"X-Padding": "x" * 20_000})
        assert too_large.status_code == 431
        assert too_large.json()["error"]["code"] == "request_header_fields_too_large"
    base_url = f"{ops_server.base_url}/v1"
    with openai.OpenAI(base_url=base_url, api_key="k1", max_retries=0) as sdk:
        assert sdk.completions.create(model="tiny", prompt="hi", max_tokens=2).choices
    with openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0) as sdk, pytest.raises(
        openai.AuthenticationError
    ):
        sdk.models.list()


def test_past_the_queue_cap_requests_get_429_and_memory_stays_flat(
    ops_server: ServerProcess, ops_client: httpx.Client
) -> None:
    with ExitStack() as streams:
        for _ in range(3):  # NOTE: one running, two queued: the cap.
            assert streams.enter_context(ops_client.stream("POST", COMPLETIONS, json=LONG_STREAM)).status_code == 200
        # NOTE: the 429's headers and body: test_app_inproc.py.
        assert ops_client.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}]}).status_code == 429
        gateway = psutil.Process(ops_server.proc.pid)
        body = {"prompt": "x " * 2000, "max_tokens": 5}

        def hammer(num_requests: int) -> None:
            for _ in range(num_requests):
                assert ops_client.post(COMPLETIONS, json=body).status_code == 429

        hammer(100)
        rss_before = gateway.memory_info().rss
        hammer(400)
        assert gateway.memory_info().rss - rss_before < 8 * 2**20


def test_keepalive_comments_arrive_while_a_stream_waits_for_its_first_token(ops_client: httpx.Client) -> None:
    with (
        ops_client.stream("POST", COMPLETIONS, json=LONG_STREAM),
        ops_client.stream("POST", COMPLETIONS, json={**LONG_STREAM, "max_tokens": 5}) as waiting,
    ):
        before_data: list[str] = []
        for line in waiting.iter_lines():
            if line.startswith("data: ") or before_data.count(": ping") == 2:
                break
            if line:
                before_data.append(line)
        assert before_data.count(": ping") == 2


def scraped(client: httpx.Client, name: str, **labels: str) -> float:
    """A metric's value summed over the samples with `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def test_closing_the_connections_of_streamed_and_whole_requests_aborts_them_all(tiny_model_dir: Path) -> None:
    with running_server(tiny_model_dir) as server, httpx.Client(base_url=server.base_url, timeout=30) as client:
        aborts_before = scraped(client, "zeroserve:request_success_total", finished_reason="abort")
        host, port = server.base_url.removeprefix("http://").split(":")
        connections = []
        for index in range(6):
            body = json.dumps({"prompt": f"Count {index}:", "max_tokens": 500, "ignore_eos": True, "stream": index % 2 == 0})
            connection = socket.create_connection((host, int(port)))
            connection.sendall(
                f"POST {COMPLETIONS} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
            )
            connections.append(connection)
        wait_for(lambda: scraped(client, "zeroserve:num_requests_running") == 6)
        for connection in connections:
            connection.close()
        wait_for(lambda: scraped(client, "zeroserve:num_requests_running") == 0)
        assert scraped(client, "zeroserve:request_success_total", finished_reason="abort") == aborts_before + 6
        assert scraped(client, "zeroserve:request_success_total", finished_reason="length") == 0
