"""The batch store: a line answered twice keeps its first result, a batch's files list its lines in
input order however they were answered, it all reads back from a new store on the same file, and
finished batches go with their files after MAX_AGE_S."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.openai import batch_store
from service.openai.batch_store import BatchStore


def new_batch(store: BatchStore, batch_id: str, num_lines: int) -> None:
    store.add_batch({"id": batch_id, "object": "batch", "status": "in_progress",
                     "request_counts": {"total": num_lines, "completed": 0, "failed": 0}})


def test_results_are_kept_once_and_the_files_follow_input_order(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "store.sqlite")
    new_batch(store, "batch_a", 4)
    for line, is_error in ((3, False), (1, True), (0, False), (3, True)):
        store.add_result("batch_a", line, {"line": line, "is_error": is_error}, is_error)
    assert store.answered_lines("batch_a") == {0, 1, 3}
    assert store.batch("batch_a")["request_counts"] == {"total": 4, "completed": 2, "failed": 1}  # type: ignore[index]
    again = BatchStore(store.path)  # NOTE: a restarted server's store.
    done = again.finish_batch("batch_a", {"status": "completed"})
    assert done is not None and done["status"] == "completed"
    output = again.file_content(done["output_file_id"])
    errors = again.file_content(done["error_file_id"])
    assert output is not None and errors is not None
    assert [json.loads(line) for line in output.decode().splitlines()] == [
        {"line": 0, "is_error": False}, {"line": 3, "is_error": False},
    ]
    assert [json.loads(line)["line"] for line in errors.decode().splitlines()] == [1]
    assert again.file(done["output_file_id"])["purpose"] == "batch_output"  # type: ignore[index]
    assert again.next_unfinished() is None


def test_an_unused_store_makes_no_file_when_polled(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "store.sqlite")
    assert store.next_unfinished() is None and not store.path.exists()
    new_batch(store, "batch_b", 1)
    assert store.next_unfinished()["id"] == "batch_b"  # type: ignore[index]
    assert store.update_batch("batch_b", {"status": "cancelling"}, only_from=("completed",)) is None
    assert store.update_batch("batch_b", {"status": "cancelling"})["status"] == "cancelling"  # type: ignore[index]


def test_a_finished_batch_keeps_its_counts_and_goes_with_its_files_after_max_age(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = BatchStore(tmp_path / "store.sqlite")
    new_batch(store, "batch_old", 1)
    store.add_result("batch_old", 0, {"line": 0}, is_error=False)
    monkeypatch.setattr(batch_store, "now", lambda: 1_000)
    old = store.finish_batch("batch_old", {"status": "completed", "completed_at": 1_000})
    assert old is not None and store.answered_lines("batch_old") == set()
    assert store.batch("batch_old")["request_counts"] == {"total": 1, "completed": 1, "failed": 0}  # type: ignore[index]
    monkeypatch.setattr(batch_store, "now", lambda: 1_000 + batch_store.MAX_AGE_S + 1)
    new_batch(store, "batch_new", 1)
    store.finish_batch("batch_new", {"status": "cancelled", "cancelled_at": batch_store.now()})
    assert store.batch("batch_old") is None and store.file(old["output_file_id"]) is None
    assert store.batch("batch_new")["request_counts"] == {"total": 1, "completed": 0, "failed": 0}  # type: ignore[index]
