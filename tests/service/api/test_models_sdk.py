"""Clients against one chosen model of a many-model server: the OpenAI SDK by id and by alias, the load and
unload routes behind --api-key, a stream kept alive while its model loads, and `zeroserve bench serve --model`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from benchmarks.real_size_ggufs import requantize
from service.bench.local_server import ServerProcess, local_server

API_KEY = "sk-test-models"
SIZES = ("--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "512")
MODELS_CONFIG = """\
[models.alpha]
aliases = ["gpt-4o-mini"]
data_parallel_size = 2

[models.beta]
max_num_seqs = 4
"""
HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hello"}]
TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def models_dir(tiny_model_dir: Path, default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """alpha and beta, each the tiny model's folder, and odd.gguf: the default model's file with a tensor no
    family has (its header passes every check, so it is listed as servable and fails only at its load)."""
    path = tmp_path_factory.mktemp("models")
    for model_id in ("alpha", "beta"):
        shutil.copytree(tiny_model_dir, path / model_id)
    requantize(default_model_path, path / "odd.gguf", lambda name: None, {"blk.0.mystery.weight": np.ones(8)})
    return path


@pytest.fixture(scope="module")
def server(models_dir: Path) -> Iterator[ServerProcess]:
    """alpha (alias gpt-4o-mini, two engines) and beta (max_num_seqs 4) behind an API key, a stream's ping every 0.2 s."""
    (config := models_dir.parent / "models.toml").write_text(MODELS_CONFIG)
    # NOTE: a store of its own: a batch kept in one another server shares would be run by that server's worker too.
    store = models_dir.parent / "store.sqlite"
    args = [
        "--models-dir", str(models_dir), "--models-config", str(config), "--api-key", API_KEY,
        "--sse-keepalive", "0.2", "--responses-store", str(store), *SIZES,
    ]
    with local_server(args, stop_timeout_s=15) as server:
        yield server


@pytest.fixture
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0) as client:
        yield client


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    """A client that sends the key."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=server.base_url, headers=headers, timeout=TIMEOUT_S) as client:
        yield client


def status_of(http: httpx.Client, model: str) -> str:
    cards = http.get("/v1/models").json()["data"]
    return str(next(card for card in cards if card["id"] == model)["status"]["value"])


def engine_commands(server: ServerProcess, model: str) -> list[str]:
    """The command lines of the engine processes serving `model`, as `ps` shows them."""
    commands = [Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ") for pid in server.engine_pids()]
    return [command for command in commands if f'"model_name": "{model}"' in command]


def test_the_sdk_lists_every_model_and_alias_and_answers_by_alias(sdk: openai.OpenAI) -> None:
    assert sorted(model.id for model in sdk.models.list()) == ["alpha", "beta", "gpt-4o-mini", "odd"]
    completion = sdk.chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=4, temperature=0)
    assert completion.model == "gpt-4o-mini"
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens == 4


def test_a_streamed_completion_on_beta_runs_with_betas_own_settings(sdk: openai.OpenAI, server: ServerProcess) -> None:
    stream = sdk.chat.completions.create(model="beta", messages=HELLO, max_tokens=4, temperature=0, stream=True)
    chunks = list(stream)
    assert {chunk.model for chunk in chunks} == {"beta"}
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert sdk.chat.completions.create(model="alpha", messages=HELLO, max_tokens=1).model == "alpha"
    [beta_command], alpha_commands = engine_commands(server, "beta"), engine_commands(server, "alpha")
    assert '"max_num_seqs": 4,' in beta_command and not any('"max_num_seqs": 4,' in c for c in alpha_commands)


def test_unloading_takes_the_key_and_leaves_the_model_unhealthy_until_loaded(
    server: ServerProcess, http: httpx.Client
) -> None:
    assert http.post("/v1/models/beta/load").json()["status"]["value"] == "loaded"
    refused = httpx.post(f"{server.base_url}/v1/models/beta/unload", timeout=TIMEOUT_S)
    assert refused.status_code == 401
    assert status_of(http, "beta") == "loaded"
    unloaded = http.post("/v1/models/beta/unload")
    assert unloaded.status_code == 200 and unloaded.json()["status"]["value"] == "unloaded"
    assert status_of(http, "beta") == "unloaded"
    health = httpx.get(f"{server.base_url}/health/beta", timeout=TIMEOUT_S)  # NOTE: open, as /health is
    assert (health.status_code, health.json()["status"]) == (503, "unloaded")
    loaded = http.post("/v1/models/beta/load")
    assert loaded.status_code == 200 and loaded.json()["status"]["value"] == "loaded"
    assert httpx.get(f"{server.base_url}/health/beta", timeout=TIMEOUT_S).status_code == 200


def test_a_stream_to_an_unloaded_model_gets_pings_while_it_loads(http: httpx.Client) -> None:
    assert http.post("/v1/models/beta/unload").json()["status"]["value"] == "unloaded"
    body = {"model": "beta", "messages": HELLO, "max_tokens": 4, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        events = [event.splitlines() for event in response.read().decode().split("\n\n") if event]
    first = next(i for i, event in enumerate(events) if any(line.startswith("data: ") for line in event))
    assert first > 0 and all(event == [": ping"] for event in events[:first])
    first_data = next(line for line in events[first] if line.startswith("data: "))
    assert json.loads(first_data.removeprefix("data: "))["model"] == "beta"
    assert events[-1][-1] == "data: [DONE]"
    assert status_of(http, "beta") == "loaded"


def test_a_stream_whose_model_fails_to_load_ends_with_an_error_event_naming_why(http: httpx.Client) -> None:
    assert status_of(http, "odd") == "unloaded"
    body = {"model": "odd", "messages": HELLO, "max_tokens": 4, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200  # NOTE: started with pings while the model loaded
        events = [event.splitlines() for event in response.read().decode().split("\n\n") if event]
    assert events[0] == [": ping"] and events[-1] == ["data: [DONE]"]
    error = json.loads(events[-2][0].removeprefix("data: "))["error"]
    assert error["code"] == "model_load_failed" and "unsupported GGUF tensor" in error["message"]
    cards = {card["id"]: card["status"] for card in http.get("/v1/models").json()["data"]}
    assert cards["odd"]["value"] == "unloaded" and cards["odd"]["failed"] is True  # NOTE: as llama.cpp's router says it
    assert "mystery" in cards["odd"]["reason"]
    assert "mystery" in http.get("/health/odd").json()["reason"]
    assert "reason" not in httpx.get(f"{http.base_url}/health/odd", timeout=TIMEOUT_S).json()  # NOTE: no key
    assert http.post("/v1/chat/completions", json={**body, "stream": False}).status_code == 503


def beta_requests_done(http: httpx.Client) -> float:
    """beta's finished requests, as /metrics counts them."""
    lines = http.get("/metrics").text.splitlines()
    prefix = "zeroserve:request_success_total{"
    return sum(float(line.split()[-1]) for line in lines if line.startswith(prefix) and 'model_name="beta"' in line)


def test_bench_serve_runs_against_the_model_it_names_with_the_servers_key(
    server: ServerProcess, http: httpx.Client, tiny_model_dir: Path, tmp_path: Path
) -> None:
    assert http.post("/v1/models/beta/load").status_code == 200
    num_done_before = beta_requests_done(http)
    result_path = tmp_path / "bench.json"
    command = [
        sys.executable, "-m", "service", "bench", "serve", "--base-url", server.base_url, "--model", "beta",
        "--api-key", API_KEY, "--tokenizer", str(tiny_model_dir), "--num-prompts", "4", "--random-input-len", "16",
        "--random-output-len", "4", "--disable-tqdm", "--result-json", str(result_path),
    ]
    run = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, run.stderr
    result = json.loads(result_path.read_text())
    assert (result["model_id"], result["completed"], result["failed"]) == ("beta", 4, 0)
    assert API_KEY not in result_path.read_text()
    assert beta_requests_done(http) == num_done_before + 4


def test_a_batchs_lines_run_on_the_models_they_name(sdk: openai.OpenAI, tmp_path: Path) -> None:
    names = ["alpha", "beta", "gpt-4o-mini", "beta", "nope"]
    lines = [
        {"custom_id": f"line-{index}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": name, "messages": HELLO, "max_tokens": 4}}
        for index, name in enumerate(names)
    ]
    (upload_path := tmp_path / "lines.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with upload_path.open("rb") as upload:
        uploaded = sdk.files.create(file=upload, purpose="batch")
    batch = sdk.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + TIMEOUT_S
    while batch.status in ("validating", "in_progress", "finalizing") and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = sdk.batches.retrieve(batch.id)
    assert batch.status == "completed" and batch.request_counts is not None, batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (4, 1)
    assert batch.output_file_id is not None and batch.error_file_id is not None
    answered = [json.loads(line) for line in sdk.files.content(batch.output_file_id).text.splitlines()]
    assert {result["custom_id"]: result["response"]["body"]["model"] for result in answered} == {
        "line-0": "alpha", "line-1": "beta", "line-2": "gpt-4o-mini", "line-3": "beta",
    }
    (failed,) = [json.loads(line) for line in sdk.files.content(batch.error_file_id).text.splitlines()]
    assert failed["custom_id"] == "line-4" and "nope" in json.dumps(failed)


def test_a_model_with_its_own_data_parallel_size_runs_that_many_engines(
    sdk: openai.OpenAI, http: httpx.Client, server: ServerProcess
) -> None:
    sdk.chat.completions.create(model="alpha", messages=HELLO, max_tokens=2)
    assert len(engine_commands(server, "alpha")) == 2
    (card,) = [card for card in http.get("/v1/models").json()["data"] if card["id"] == "alpha"]
    status = card["status"]
    assert status["value"] == "loaded" and status["num_engines"] == 2
    assert status["memory_bytes"] > status["weight_bytes"] + status["kv_cache_bytes"] > 0
    metrics = http.get("/metrics").text
    assert 'engine="1",model_name="alpha"' in metrics


def test_the_anthropic_sdk_and_the_responses_api_reach_the_model_they_name(
    sdk: openai.OpenAI, server: ServerProcess
) -> None:
    with anthropic.Anthropic(base_url=server.base_url, api_key=API_KEY, max_retries=0) as claude:
        message = claude.messages.create(
            model="beta", max_tokens=3, messages=[{"role": "user", "content": "Hello"}]
        )
    assert message.model == "beta" and message.usage.output_tokens > 0
    response = sdk.responses.create(model="gpt-4o-mini", input="Hello", max_output_tokens=3, store=False)
    assert response.model == "gpt-4o-mini" and response.output_text
