"""The batch store: a line answered twice keeps its first result, a batch's files list its lines in
input order however they were answered, and it all reads back from a new store on the same file."""

from __future__ import annotations

import json
from pathlib import Path

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
