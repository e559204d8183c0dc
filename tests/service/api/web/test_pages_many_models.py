"""The pages of a multi-model server, against one real `zeroserve serve --models-dir` of two tiny
models (beta with its own temperature, from --models-config): the playground's settings of each
model with every model's status, the dashboard's feed of one model through its load and reload,
/version once a model is loaded, and in Chromium, both pages' model pickers."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.bench.local_server import ServerProcess, local_server
from tests.service.api.web.browser import Watched

SIZES = ("--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "512")
# NOTE: frames come about once a second; a load of a tiny model takes a few, on a busy machine some more.
MAX_FRAMES = 120


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    models = tmp_path_factory.mktemp("models")
    for name in ("alpha", "beta"):
        shutil.copytree(tiny_model_dir, models / name)
    config = tmp_path_factory.mktemp("config") / "models.toml"
    config.write_text("[models.beta]\noverride_generation_config = {temperature = 0.3}\n")
    with local_server(["--models-dir", str(models), "--models-config", str(config), *SIZES], timeout_s=600) as server:
        yield server


def chat(server: ServerProcess, model: str) -> str:
    """Asks `model` for a few tokens (loading it first if it is not) and returns the request's id."""
    response = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=300, json={
        "model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 3,
    })
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def unload(server: ServerProcess, model: str) -> None:
    response = httpx.post(f"{server.base_url}/v1/models/{model}/unload", timeout=60)
    assert response.status_code == 200 and response.json()["status"]["value"] == "unloaded", response.text


def frames(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[len("data: "):])


def frame_with(stream: Iterator[dict[str, Any]], request_id: str) -> dict[str, Any]:
    """The first frame that lists the request among the recent ones."""
    for _, frame in zip(range(MAX_FRAMES), stream, strict=False):
        if any(request["request_id"] == request_id for request in frame["recent_requests"]):
            return frame
    raise AssertionError(f"no frame listed {request_id}")


def test_the_playground_reads_each_models_own_defaults_and_every_models_status(server: ServerProcess) -> None:
    for model in ("alpha", "beta"):
        unload(server, model)
    assert "cpu" not in httpx.get(f"{server.base_url}/version").json()
    first = httpx.get(f"{server.base_url}/playground/settings").json()
    assert first["models"] == ["alpha", "beta"] and first["model"] == "alpha"
    assert first["statuses"] == {"alpha": "unloaded", "beta": "unloaded"}
    assert first["defaults"]["temperature"] == 1.0 and first["max_model_len"] == 512
    beta = httpx.get(f"{server.base_url}/playground/settings", params={"model": "beta"}).json()
    assert beta["model"] == "beta" and beta["defaults"]["temperature"] == 0.3
    unknown = httpx.get(f"{server.base_url}/playground/settings", params={"model": "gamma"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"

    chat(server, "beta")
    loaded = httpx.get(f"{server.base_url}/playground/settings", params={"model": "beta"}).json()
    assert loaded["statuses"] == {"alpha": "unloaded", "beta": "loaded"}
    assert loaded["defaults"] == beta["defaults"] and loaded["max_model_len"] == 512
    version = httpx.get(f"{server.base_url}/version").json()
    assert version["cpu"] and version["kernels"]


def test_the_dashboard_follows_one_model_through_its_load_and_reload(server: ServerProcess) -> None:
    unload(server, "alpha")
    with httpx.stream("GET", f"{server.base_url}/dashboard/events", params={"model": "alpha"}, timeout=60) as response:
        assert response.status_code == 200
        stream = frames(response)
        waiting = next(stream)
        assert (waiting["model"], waiting["engine_status"]) == ("alpha", "unloaded")
        assert waiting["engines"] == [] and waiting["recent_requests"] == [] and waiting["num_running_reqs"] == 0

        first_id = chat(server, "alpha")
        serving = frame_with(stream, first_id)
        assert serving["engine_status"] == "ok" and [engine["engine"] for engine in serving["engines"]] == ["0"]
        assert serving["num_finished"]["length"] == 1

        # NOTE: a reload is new engines with new counters: the feed starts again from them.
        unload(server, "alpha")
        second_id = chat(server, "alpha")
        reloaded = frame_with(stream, second_id)
        assert [request["request_id"] for request in reloaded["recent_requests"]] == [second_id]
        assert reloaded["num_finished"]["length"] == 1

    # NOTE: without ?model=, the first loaded model's feed: alpha's (loaded, and listed before beta).
    with httpx.stream("GET", f"{server.base_url}/dashboard/events", timeout=60) as response:
        assert next(frames(response))["model"] == "alpha"


def test_the_playgrounds_picker_shows_each_models_status_and_defaults(watched: Watched, server: ServerProcess) -> None:
    from playwright.sync_api import expect

    unload(server, "beta")
    page = watched.page
    page.goto("/")
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#model")).to_be_enabled()
    assert page.locator("#model option").all_inner_texts() == ["alpha", "beta"]
    assert page.locator("#temperature").input_value() == "1"
    assert page.locator("#max_tokens").get_attribute("max") == "512"
    page.locator("#model").select_option("beta")
    expect(page.locator("#model-status")).to_have_text("unloaded: loads on first request")
    expect(page.locator("#temperature")).to_have_value("0.3")

    page.locator("#max_tokens").fill("3")
    page.locator("#max_tokens").dispatch_event("change")
    page.locator("#prompt").fill("Hello")
    with page.expect_request(lambda request: request.url.endswith("/v1/chat/completions")) as sent:
        page.locator("#prompt").press("Enter")
    assert json.loads(sent.value.post_data or "{}")["model"] == "beta"
    expect(page.locator(".message.assistant [data-stat=finish]")).to_have_text("length", timeout=300_000)
    expect(page.locator("#model-status")).to_have_text("loaded")
    page.reload()
    expect(page.locator("#app")).to_be_visible()
    assert page.locator("#model").input_value() == "beta" and page.locator("#temperature").input_value() == "0.3"


def test_the_dashboards_picker_switches_the_feed_to_the_model_picked(watched: Watched, server: ServerProcess) -> None:
    from playwright.sync_api import expect

    unload(server, "beta")
    chat(server, "alpha")
    page = watched.page
    page.goto("/dashboard")
    expect(page.locator("#model")).to_be_visible()
    assert page.locator("#model option").all_inner_texts() == ["alpha", "beta"]
    expect(page.locator("#model")).to_have_value("alpha")
    expect(page.locator("#engine-status")).to_have_text("serving")
    expect(page.locator("tr[data-engine='0']")).to_have_count(1)
    page.locator("#model").select_option("beta")
    expect(page.locator("#engine-status")).to_have_text("not loaded (loads on its first request)")
    expect(page.locator("tr[data-engine]")).to_have_count(0)
    expect(page.locator("#recent-requests tr")).to_have_count(0)
