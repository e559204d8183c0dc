"""The SQLite store of Responses: what it keeps survives a new store on the same file, and it
holds its age and size bounds, dropping the oldest first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proto.envs import cache_dir
from service.openai.response_store import ResponseStore, open_store, store_path


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def response(response_id: str, text: str = "hi") -> dict[str, Any]:
    return {"id": response_id, "status": "completed", "output": [{"type": "message", "content": text}]}


def test_a_kept_response_is_read_back_by_a_new_store_on_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "responses.sqlite"
    items = [{"type": "message", "id": "msg_1", "role": "user", "content": "Hi"}]
    ResponseStore(path).put(response("resp_1"), items)
    stored = ResponseStore(path).get("resp_1")
    assert stored is not None and stored.response == response("resp_1") and stored.input_items == items
    assert stored.conversation == [*items, *response("resp_1")["output"]]
    assert ResponseStore(path).get("resp_2") is None


def test_putting_an_id_again_replaces_it_and_delete_forgets_it(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "responses.sqlite")
    store.put(response("resp_1") | {"status": "queued"}, [])
    store.put(response("resp_1"), [])
    stored = store.get("resp_1")
    assert stored is not None and stored.response["status"] == "completed"
    assert store.delete("resp_1") is True and store.get("resp_1") is None
    assert store.delete("resp_1") is False


def test_responses_past_the_age_bound_are_gone(tmp_path: Path) -> None:
    clock = Clock()
    store = ResponseStore(tmp_path / "responses.sqlite", max_age_s=100.0, clock=clock)
    store.put(response("resp_old"), [])
    clock.now += 60
    store.put(response("resp_new"), [])
    clock.now += 60
    assert store.get("resp_old") is None and store.get("resp_new") is not None


def test_past_the_size_bound_the_oldest_go_first(tmp_path: Path) -> None:
    clock = Clock()
    one_size = len('{"id": "resp_0", "status": "completed", "output": [{"type": "message", "content": "' + "x" * 100)
    store = ResponseStore(tmp_path / "responses.sqlite", max_bytes=3 * one_size + 50, clock=clock)
    for index in range(5):
        store.put(response(f"resp_{index}", "x" * 100), [])
        clock.now += 1
    kept = [index for index in range(5) if store.get(f"resp_{index}") is not None]
    assert kept == [2, 3, 4]


def test_the_setting_names_a_file_the_cache_default_or_off(tmp_path: Path) -> None:
    assert store_path(str(tmp_path / "r.sqlite")) == tmp_path / "r.sqlite"
    assert store_path("") == cache_dir() / "responses.sqlite"
    assert store_path("off") is None


def test_a_starting_server_fails_the_responses_its_last_run_left_unfinished(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite"
    store = ResponseStore(path)
    for status in ("queued", "in_progress", "completed"):
        store.put(response(f"resp_{status}") | {"status": status, "error": None}, [])
    reopened = open_store(str(path))
    assert reopened is not None
    statuses = {}
    for status in ("queued", "in_progress", "completed"):
        stored = reopened.get(f"resp_{status}")
        assert stored is not None
        statuses[status] = (stored.response["status"], stored.response["error"] is not None)
    assert statuses == {"queued": ("failed", True), "in_progress": ("failed", True), "completed": ("completed", False)}
