"""The SQLite store of Responses: what it keeps survives a new store on the same file, an id is kept
once and an ended response stays ended, a starting server fails only its own unfinished responses,
and it holds its age and size bounds (the Batch API's bytes counted), dropping the oldest first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proto.envs import cache_dir
from service.openai.batch_store import BatchStore
from service.openai.response_store import ResponseExistsError, ResponseStore, open_store, store_path


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
    ResponseStore(path).add(response("resp_1"), items)
    stored = ResponseStore(path).get("resp_1")
    assert stored is not None and stored.response == response("resp_1") and stored.input_items == items
    assert stored.conversation == [*items, *response("resp_1")["output"]]
    assert ResponseStore(path).get("resp_2") is None


def test_an_id_is_kept_once_and_an_unfinished_response_moves_on_until_it_ends(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "responses.sqlite")
    store.add(response("resp_1") | {"status": "queued"}, [])
    with pytest.raises(ResponseExistsError, match="resp_1"):
        store.add(response("resp_1", "another answer"), [])
    assert store.update(response("resp_1")) is True
    stored = store.get("resp_1")
    assert stored is not None and stored.response == response("resp_1")
    # NOTE: an ended response stays as it ended.
    assert store.update(response("resp_1", "later")) is False
    assert store.get("resp_1").response == response("resp_1")  # type: ignore[union-attr]


def test_a_cancel_or_delete_is_not_undone_by_the_answer_finishing_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite"
    running, other_process = ResponseStore(path), ResponseStore(path)
    for response_id in ("resp_cancelled", "resp_deleted"):
        running.add(response(response_id) | {"status": "in_progress"}, [])
    assert other_process.update(response("resp_cancelled") | {"status": "cancelled"}) is True
    assert other_process.delete("resp_deleted") is True and other_process.delete("resp_deleted") is False
    assert running.update(response("resp_cancelled")) is False
    assert running.update(response("resp_deleted")) is False
    assert running.get("resp_cancelled").response["status"] == "cancelled"  # type: ignore[union-attr]
    assert running.get("resp_deleted") is None


def test_responses_past_the_age_bound_are_gone(tmp_path: Path) -> None:
    clock = Clock()
    store = ResponseStore(tmp_path / "responses.sqlite", max_age_s=100.0, clock=clock)
    store.add(response("resp_old"), [])
    clock.now += 60
    store.add(response("resp_new"), [])
    clock.now += 60
    assert store.get("resp_old") is None and store.get("resp_new") is not None


def test_past_the_size_bound_the_oldest_go_first(tmp_path: Path) -> None:
    clock = Clock()
    one_size = len('{"id": "resp_0", "status": "completed", "output": [{"type": "message", "content": "' + "x" * 100)
    store = ResponseStore(tmp_path / "responses.sqlite", max_bytes=3 * one_size + 50, clock=clock)
    for index in range(5):
        store.add(response(f"resp_{index}", "x" * 100), [])
        clock.now += 1
    kept = [index for index in range(5) if store.get(f"resp_{index}") is not None]
    assert kept == [2, 3, 4]


def test_the_setting_names_a_file_the_cache_default_or_off(tmp_path: Path) -> None:
    assert store_path(str(tmp_path / "r.sqlite")) == tmp_path / "r.sqlite"
    assert store_path("") == cache_dir() / "responses.sqlite"
    assert store_path("off") is None


def test_the_batch_apis_bytes_count_toward_the_bound(tmp_path: Path) -> None:
    clock = Clock()
    path = tmp_path / "responses.sqlite"
    store = ResponseStore(path, max_bytes=1000, clock=clock)
    store.add(response("resp_0", "x" * 100), [])
    clock.now += 1
    BatchStore(path, max_bytes=1000).add_file("in.jsonl", "batch", b"y" * 850)
    store.add(response("resp_1", "x" * 10), [])
    assert store.get("resp_0") is None and store.get("resp_1") is not None


def test_a_starting_server_fails_only_the_responses_it_left_unfinished(tmp_path: Path) -> None:
    path = tmp_path / "responses.sqlite"
    first, second = ResponseStore(path, owner="port 8000"), ResponseStore(path, owner="port 8001")
    for status in ("queued", "in_progress", "completed"):
        first.add(response(f"resp_{status}") | {"status": status, "error": None}, [])
    second.add(response("resp_second") | {"status": "in_progress", "error": None}, [])
    reopened = open_store(str(path), owner="port 8000")
    assert reopened is not None
    statuses = {}
    for status in ("queued", "in_progress", "completed"):
        stored = reopened.get(f"resp_{status}")
        assert stored is not None
        statuses[status] = (stored.response["status"], stored.response["error"] is not None)
    assert statuses == {"queued": ("failed", True), "in_progress": ("failed", True), "completed": ("completed", False)}
    # NOTE: the other server's background response runs on there, untouched.
    assert reopened.get("resp_second").response["status"] == "in_progress"  # type: ignore[union-attr]
