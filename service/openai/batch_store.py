"""The Batch API's files, batches and their lines' results, kept in SQLite so that a restarted server
continues its batches where they stopped: a line's result is written as soon as it is answered, once
(its batch and line are the key), and a batch's output and error files are made from them when the
last line is answered.

Its tables (`batch_*`) share the stored Responses' database file (--responses-store). Every call
opens its own connection: the store is read from the event loop's threads (`asyncio.to_thread`) and
from several gateway processes (--api-server-count), which SQLite serialises by its file lock.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

# A batch's life, as OpenAI's Batch API names it; the worker picks the unfinished ones up.
UNFINISHED_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
FINISHED_STATUSES = ("completed", "cancelled", "failed")
# NOTE: as OpenAI keeps a batch's output files; a finished batch and its files go this long after.
MAX_AGE_S = 30 * 24 * 3600

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, object TEXT NOT NULL, content BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, status TEXT NOT NULL, object TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, is_error INTEGER NOT NULL, result TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);
"""


def now() -> int:
    return int(time.time())


class BatchStore:
    """Files (`file` objects and their bytes), batches (`batch` objects) and each line's result."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._has_schema = False

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection in one transaction (committed when the block ends, rolled back if it raises)."""
        if not self._has_schema:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(sqlite3.connect(self.path, timeout=30.0)) as connection, connection:
            if not self._has_schema:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.executescript(_SCHEMA)
                self._has_schema = True
            yield connection

    def _has_batches_table(self) -> bool:
        if not self.path.exists():
            return False
        with closing(sqlite3.connect(self.path, timeout=30.0)) as db:
            return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'batch_batches'").fetchone() is not None

    # Files.

    def add_file(self, filename: str, purpose: str, content: bytes) -> dict[str, Any]:
        file = _file_object(filename, purpose, len(content))
        with self._connect() as db:
            db.execute("INSERT INTO batch_files (id, object, content) VALUES (?, ?, ?)",
                       (file["id"], json.dumps(file), content))
        return file

    def file(self, file_id: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute("SELECT object FROM batch_files WHERE id = ?", (file_id,)).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def file_content(self, file_id: str) -> bytes | None:
        with self._connect() as db:
            row = db.execute("SELECT content FROM batch_files WHERE id = ?", (file_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def files(self, purpose: str | None = None) -> list[dict[str, Any]]:
        """Every file, newest first (of one purpose when given)."""
        with self._connect() as db:
            rows = db.execute("SELECT object FROM batch_files ORDER BY seq DESC").fetchall()
        files = [json.loads(row[0]) for row in rows]
        return [file for file in files if purpose is None or file["purpose"] == purpose]

    def delete_file(self, file_id: str) -> bool:
        with self._connect() as db:
            return db.execute("DELETE FROM batch_files WHERE id = ?", (file_id,)).rowcount > 0

    # Batches.

    def add_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        with self._connect() as db:
            db.execute("INSERT INTO batch_batches (id, status, object) VALUES (?, ?, ?)",
                       (batch["id"], batch["status"], json.dumps(batch)))
        return self._with_counts(batch)

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute("SELECT object FROM batch_batches WHERE id = ?", (batch_id,)).fetchone()
        return None if row is None else self._with_counts(json.loads(row[0]))

    def batches(self, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """Up to `limit` batches, newest first, from the one after `after`; and whether more follow."""
        with self._connect() as db:
            start = db.execute("SELECT seq FROM batch_batches WHERE id = ?", (after,)).fetchone() if after else None
            rows = db.execute(
                "SELECT object FROM batch_batches WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                (start[0] if start else 2**62, limit + 1),
            ).fetchall()
        return [self._with_counts(json.loads(row[0])) for row in rows[:limit]], len(rows) > limit

    def next_unfinished(self) -> dict[str, Any] | None:
        """The oldest batch not yet completed, cancelled or failed."""
        if not self._has_schema and not self._has_batches_table():
            return None  # NOTE: no batch yet; the worker's polls make no file and no table.
        marks = ", ".join("?" * len(UNFINISHED_STATUSES))
        with self._connect() as db:
            row = db.execute(
                f"SELECT object FROM batch_batches WHERE status IN ({marks}) ORDER BY seq LIMIT 1",
                UNFINISHED_STATUSES,
            ).fetchone()
        return None if row is None else self._with_counts(json.loads(row[0]))

    def update_batch(
        self, batch_id: str, changes: dict[str, Any], only_from: tuple[str, ...] | None = None
    ) -> dict[str, Any] | None:
        """The batch with `changes` made, or None when there is none (or its status is not in `only_from`)."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT object FROM batch_batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                return None
            batch = json.loads(row[0])
            if only_from is not None and batch["status"] not in only_from:
                return None
            batch.update(changes)
            db.execute("UPDATE batch_batches SET status = ?, object = ? WHERE id = ?",
                       (batch["status"], json.dumps(batch), batch_id))
        return self._with_counts(batch)

    # Lines' results.

    def add_result(self, batch_id: str, line: int, result: dict[str, Any], is_error: bool) -> None:
        """Keeps a line's result; a line answered already keeps its first."""
        with self._connect() as db:
            db.execute("INSERT OR IGNORE INTO batch_results VALUES (?, ?, ?, ?)",
                       (batch_id, line, int(is_error), json.dumps(result, ensure_ascii=False)))

    def answered_lines(self, batch_id: str) -> set[int]:
        with self._connect() as db:
            rows = db.execute("SELECT line FROM batch_results WHERE batch_id = ?", (batch_id,)).fetchall()
        return {row[0] for row in rows}

    def finish_batch(self, batch_id: str, changes: dict[str, Any]) -> dict[str, Any] | None:
        """Makes the batch's output and error files (its answered lines in input order, answers in the
        one, errors in the other; none when empty), records them and its counts with `changes` (the
        lines' results, now in the files, are dropped), and forgets the batches finished more than
        MAX_AGE_S ago with their files; in one transaction."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            rows = db.execute(
                "SELECT is_error, result FROM batch_results WHERE batch_id = ? ORDER BY line", (batch_id,)
            ).fetchall()
            row = db.execute("SELECT object FROM batch_batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                return None
            batch: dict[str, Any] = json.loads(row[0])
            num_failed = sum(is_error for is_error, _ in rows)
            batch["request_counts"] = {
                "total": batch["request_counts"]["total"], "completed": len(rows) - num_failed, "failed": num_failed,
            }
            for is_error, key, name in ((0, "output_file_id", "output"), (1, "error_file_id", "error")):
                lines = [result for error, result in rows if error == is_error]
                if lines:
                    content = "".join(line + "\n" for line in lines).encode()
                    file = _file_object(f"{batch_id}_{name}.jsonl", "batch_output", len(content))
                    file["expires_at"] = file["created_at"] + MAX_AGE_S
                    db.execute("INSERT INTO batch_files (id, object, content) VALUES (?, ?, ?)",
                               (file["id"], json.dumps(file), content))
                    batch[key] = file["id"]
            batch.update(changes)
            db.execute("UPDATE batch_batches SET status = ?, object = ? WHERE id = ?",
                       (batch["status"], json.dumps(batch), batch_id))
            db.execute("DELETE FROM batch_results WHERE batch_id = ?", (batch_id,))
            _forget_old_batches(db)
        return batch

    def _with_counts(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch with its request_counts: its lines, and those answered and failed so far (a
        finished batch's, kept with it)."""
        if batch["status"] in FINISHED_STATUSES:
            return batch
        with self._connect() as db:
            num_failed, num_answered = db.execute(
                "SELECT COALESCE(SUM(is_error), 0), COUNT(*) FROM batch_results WHERE batch_id = ?", (batch["id"],)
            ).fetchone()
        counts = {"total": batch["request_counts"]["total"], "completed": num_answered - num_failed,
                  "failed": num_failed}
        return batch | {"request_counts": counts}


def _forget_old_batches(db: sqlite3.Connection) -> None:
    """Deletes the batches finished more than MAX_AGE_S ago, and their output and error files."""
    cutoff = now() - MAX_AGE_S
    for (text,) in db.execute("SELECT object FROM batch_batches").fetchall():
        batch = json.loads(text)
        finished_at = next((batch.get(f"{status}_at") for status in FINISHED_STATUSES if batch.get(f"{status}_at")), None)
        if batch["status"] in FINISHED_STATUSES and finished_at is not None and finished_at < cutoff:
            db.execute("DELETE FROM batch_batches WHERE id = ?", (batch["id"],))
            db.executemany("DELETE FROM batch_files WHERE id = ?",
                           [(batch[key],) for key in ("output_file_id", "error_file_id") if batch.get(key)])


def _file_object(filename: str, purpose: str, num_bytes: int) -> dict[str, Any]:
    """OpenAI's `file` object for a new file."""
    return {
        "id": f"file-{uuid.uuid4().hex}", "object": "file", "bytes": num_bytes, "created_at": now(),
        "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None, "status_details": None,
    }
