"""Many models in one server (issue 45), as a user runs it: `zeroserve serve --models-dir` with real engines,
loaded when a request names a model and unloaded to keep within --memory-budget, --max-loaded-models and
--idle-unload-s, a broken file listed with its reason, and a killed engine costing only its own model."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from service.bench.local_server import ServerProcess, local_server
from service.observability.picker_metrics import PICKER_FAMILIES
from tests.engine_proc.kv_router import apply_batch, replay
from tests.server_process import free_engine_port
from tests.service.api.picker_reader import VLLM_MAPPING, read_as_the_picker

MODEL_IDS = ("alpha", "beta", "gamma")
SIZES = ("--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "512")
# NOTE: polls follow what the server says; this only bounds one that never gets there.
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def models_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """alpha, beta and gamma (each the tiny model's folder) and broken.gguf, a file no engine can read."""
    path = tmp_path_factory.mktemp("models")
    for model_id in MODEL_IDS:
        shutil.copytree(tiny_model_dir, path / model_id)
    (path / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 60)
    return path


@pytest.fixture(scope="module")
def one_at_a_time(models_dir: Path) -> Iterator[ServerProcess]:
    """A server that keeps one model loaded, and unloads it after a second unused."""
    with local_server(
        ["--models-dir", str(models_dir), *SIZES, "--max-loaded-models", "1", "--idle-unload-s", "1"], stop_timeout_s=15
    ) as server:
        yield server


@pytest.fixture(scope="module")
def engine_bytes(one_at_a_time: ServerProcess) -> int:
    """What one model's engine reports holding once loaded (its peak RSS)."""
    answer = httpx.post(f"{one_at_a_time.base_url}/v1/models/alpha/load", timeout=DEADLINE_S).json()
    assert answer["status"]["value"] == "loaded", answer
    return int(answer["status"]["memory_bytes"])


@pytest.fixture(scope="module")
def budget(engine_bytes: int) -> int:
    """Room for two models' engines, not three."""
    return int(2.5 * engine_bytes)


@pytest.fixture(scope="module")
def two_fit(models_dir: Path, budget: int) -> Iterator[ServerProcess]:
    """A server with room for two of the models."""
    args = ["--models-dir", str(models_dir), *SIZES, "--memory-budget", str(budget)]
    with local_server(args, stop_timeout_s=15) as server:
        yield server


class PoolWatch:
    """Samples the summed RSS of a gateway's engine processes (every 50 ms) and its /v1/models (every 100 ms)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.max_rss_bytes = 0
        self.max_num_loaded = 0
        self.statuses: dict[str, list[str]] = {}  # NOTE: each model's status as it changed, first seen first
        self._is_stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-watch")

    def __enter__(self) -> PoolWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._is_stopping.set()
        self._thread.join()

    def _run(self) -> None:
        with httpx.Client(base_url=self.server.base_url, timeout=30) as client:
            num_ticks = 0
            while not self._is_stopping.wait(0.05):
                self.max_rss_bytes = max(self.max_rss_bytes, engines_rss_bytes(self.server))
                if num_ticks % 2 == 0:
                    self._see(client.get("/v1/models").json()["data"])
                num_ticks += 1

    def _see(self, cards: list[dict[str, Any]]) -> None:
        values = {str(card["id"]): str(card["status"]["value"]) for card in cards}
        self.max_num_loaded = max(self.max_num_loaded, list(values.values()).count("loaded"))
        for model_id, value in values.items():
            seen = self.statuses.setdefault(model_id, [])
            if not seen or seen[-1] != value:
                seen.append(value)


def engines_rss_bytes(server: ServerProcess) -> int:
    """The resident memory of the gateway's engine processes together (one that just exited counts 0)."""
    total = 0
    for pid in server.engine_pids():
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += sum(int(line.split()[1]) * 1024 for line in lines if line.startswith("VmRSS:"))
    return total


def engine_pid(server: ServerProcess, model_id: str) -> int:
    """The pid of the engine process serving `model_id` (its command line names it)."""
    pids = [pid for pid in server.engine_pids() if f'"model_name": "{model_id}"' in command_line(pid)]
    assert len(pids) == 1, f"{model_id}'s engines: {pids}"
    return pids[0]


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


def chat(client: httpx.Client, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3}
    return client.post("/v1/chat/completions", json=body)


def statuses(client: httpx.Client) -> dict[str, dict[str, object]]:
    """Each listed model's `status` in /v1/models."""
    return {card["id"]: card["status"] for card in client.get("/v1/models").json()["data"]}


@pytest.fixture
def client(two_fit: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=two_fit.base_url, timeout=DEADLINE_S) as client:
        yield client


def test_models_taking_turns_stay_within_the_memory_budget(
    two_fit: ServerProcess, client: httpx.Client, budget: int
) -> None:
    with PoolWatch(two_fit) as watch:
        for model in MODEL_IDS * 2:
            answer = chat(client, model)
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == model
    assert 0 < watch.max_rss_bytes <= budget
    assert watch.max_num_loaded <= 2
    # NOTE: two fit: the last two models asked for are both still loaded, the third is not.
    now = {model: status["value"] for model, status in statuses(client).items()}
    assert (now["alpha"], now["beta"], now["gamma"]) == ("unloaded", "loaded", "loaded")
    for model in MODEL_IDS:
        seen = ",".join(watch.statuses[model])
        assert "loading,loaded,unloaded" in seen, f"{model}: {seen}"


def test_a_broken_file_is_listed_failed_with_its_reason_and_the_others_serve(client: httpx.Client) -> None:
    broken = statuses(client)["broken"]
    assert (broken["value"], broken["failed"]) == ("unloaded", True)
    assert "broken.gguf" in str(broken["reason"])
    refused = chat(client, "broken")
    assert refused.status_code == 503
    error = refused.json()["error"]
    assert error["code"] == "model_load_failed" and str(broken["reason"]) in error["message"]
    assert chat(client, "alpha").status_code == 200
    assert chat(client, "nobody").json()["error"]["code"] == "model_not_found"


def test_metrics_label_each_loaded_model_and_say_each_status(client: httpx.Client) -> None:
    assert chat(client, "alpha").status_code == 200
    text = client.get("/metrics").text
    assert 'model_name="alpha"' in text.split("zeroserve:model_status", 1)[0]  # NOTE: the engines' own series
    assert 'zeroserve:model_status{model_name="alpha",status="loaded"} 1.0' in text
    assert 'zeroserve:model_status{model_name="broken",status="failed"} 1.0' in text
    assert "zeroserve:model_memory_bytes{" in text


def test_a_killed_engine_costs_only_its_own_model(two_fit: ServerProcess, client: httpx.Client) -> None:
    for model in ("alpha", "beta"):
        assert chat(client, model).status_code == 200
    assert {statuses(client)[model]["value"] for model in ("alpha", "beta")} == {"loaded"}
    alpha_pid, beta_pid = engine_pid(two_fit, "alpha"), engine_pid(two_fit, "beta")
    beta_codes: list[int] = []
    is_done = threading.Event()

    def keep_asking_beta() -> None:
        with httpx.Client(base_url=two_fit.base_url, timeout=DEADLINE_S) as beta_client:
            while not is_done.is_set() or not beta_codes:
                beta_codes.append(chat(beta_client, "beta").status_code)

    asker = threading.Thread(target=keep_asking_beta, name="beta-asker")
    asker.start()
    try:
        os.kill(alpha_pid, signal.SIGKILL)
        # NOTE: alpha's request waits for its engine to come back (restarted, or loaded again).
        answer = chat(client, "alpha")
    finally:
        is_done.set()
        asker.join()
    assert answer.status_code == 200, answer.text
    assert engine_pid(two_fit, "alpha") != alpha_pid
    assert engine_pid(two_fit, "beta") == beta_pid
    assert beta_codes and set(beta_codes) == {200}


def test_one_model_at_a_time_and_an_idle_one_is_unloaded(one_at_a_time: ServerProcess) -> None:
    with PoolWatch(one_at_a_time) as watch, httpx.Client(base_url=one_at_a_time.base_url, timeout=DEADLINE_S) as client:
        for model in ("alpha", "beta"):
            assert chat(client, model).status_code == 200
        assert statuses(client)["alpha"]["value"] == "unloaded"
        deadline = time.monotonic() + DEADLINE_S
        while statuses(client)["beta"]["value"] != "unloaded":
            assert time.monotonic() < deadline, "beta was never unloaded for being idle"
            time.sleep(0.1)
    assert watch.max_num_loaded == 1
    assert one_at_a_time.engine_pids() == []


def test_two_models_publish_kv_events_on_ports_of_their_own_and_the_picker_reads_both(models_dir: Path) -> None:
    port, replay_port = free_engine_port(), free_engine_port()
    kv_events = {
        "enable_kv_cache_events": True, "endpoint": f"tcp://127.0.0.1:{port}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay_port}", "topic": "kv-events",
    }
    args = [str(models_dir / "alpha"), str(models_dir / "beta"), *SIZES, "--kv-events-config", json.dumps(kv_events)]
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        with local_server(args, stop_timeout_s=15) as server, httpx.Client(base_url=server.base_url, timeout=DEADLINE_S) as client:
            for model_id in ("alpha", "beta"):
                body = {"model": model_id, "prompt": f"a prompt of more than one block for {model_id} " * 8, "max_tokens": 2}
                response = client.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
            # NOTE: each model's one engine: the configured ports plus the model's index.
            for model_index in (0, 1):
                batches = [msgpack.unpackb(payload) for payload in replay(ctx, f"tcp://127.0.0.1:{replay_port + model_index}", 0).values()]
                cached: set[int] = set()
                for batch in batches:
                    apply_batch(cached, batch)
                assert cached, f"model {model_index} published no stored blocks"
            text = client.get("/metrics").text
    finally:
        ctx.destroy(linger=0)
    samples = {f.name: f.samples for f in text_string_to_metric_families(text) if f.name.startswith("vllm:")}
    assert {name: len(family) for name, family in samples.items()} == dict.fromkeys(PICKER_FAMILIES, 1)
    pod = read_as_the_picker(text, VLLM_MAPPING)
    # NOTE: zeroserve's own cache_config_info: a series per model's engine.
    num_blocks = [
        int(sample.labels["num_gpu_blocks"]) for family in text_string_to_metric_families(text)
        if family.name == "zeroserve:cache_config_info" for sample in family.samples
    ]
    assert pod.errors == [] and len(num_blocks) == 2
    assert (pod.waiting_queue_size, pod.running_requests_size) == (0, 0)
    assert pod.cache_num_blocks == sum(num_blocks)
