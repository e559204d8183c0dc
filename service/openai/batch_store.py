"""The Batch API's files, batches and their lines' results, kept in SQLite so that a restarted server
continues its batches where they stopped: a line's result is written as soon as it is answered, once
(its batch and line are the key), and a batch's output and error files are made from them when the
last line is answered.

Its tables (`batch_*`) share the stored Responses' database file (--responses-store). Every call
opens its own connection: the store is read from the event loop's threads (`asyncio.to_thread`) and
from several gateway processes (--api-server-count), which SQLite serialises by its file lock.

Every file and batch records its owner (--store-owner: by default the server's port), and a store sees
only its owner's: two servers sharing one file (the default store is one per user) never run, read or
cancel each other's batches. Input files expire (`expires_at`, 30 days unless the upload says), and
the files' bytes with the lines' results are held within the store's size bound (--store-max-size).
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

from service.openai.errors import APIError

# A batch's life, as OpenAI's Batch API names it; the worker picks the unfinished ones up.
UNFINISHED_STATUSES = ("validating", "in_progress", "finalizing", "cancelling")
FINISHED_STATUSES = ("completed", "expired", "cancelled", "failed")
# NOTE: as OpenAI keeps a batch's output files; a finished batch and its files go this long after.
MAX_AGE_S = 30 * 24 * 3600
# NOTE: OpenAI's default for a file of purpose "batch"; an upload's expires_after may shorten it.
DEFAULT_FILE_TTL_S = 30 * 24 * 3600
DEFAULT_MAX_BYTES = 2**30

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, object TEXT NOT NULL, content BLOB NOT NULL,
    owner TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS batch_batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL, status TEXT NOT NULL, object TEXT NOT NULL,
    owner TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS batch_results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, is_error INTEGER NOT NULL, result TEXT NOT NULL,
    PRIMARY KEY (batch_id, line)
);
"""


def now() -> int:
    return int(time.time())


class BatchStore:
    """One owner's files (`file` objects and their bytes), batches (`batch` objects) and each line's result."""

    def __init__(self, path: Path, owner: str = "", max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.path = path
        self.owner = owner
        self.max_bytes = max_bytes
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
                _add_owners(connection, self.owner)
                self._has_schema = True
            yield connection

    def _has_batches_table(self) -> bool:
        if not self.path.exists():
            return False
        with closing(sqlite3.connect(self.path, timeout=30.0)) as db:
            return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'batch_batches'").fetchone() is not None

    # Files.

    def add_file(
        self, filename: str, purpose: str, content: bytes, expires_after_s: int | None = DEFAULT_FILE_TTL_S
    ) -> dict[str, Any]:
        """Keeps an uploaded file (gone `expires_after_s` from now; None: kept until deleted), first
        forgetting expired files; a 400 naming --store-max-size when the files and results already kept
        leave no room for it."""
        file = _file_object(filename, purpose, len(content))
        if expires_after_s is not None:
            file["expires_at"] = file["created_at"] + expires_after_s
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            _forget_expired_files(db)
            # NOTE: kept Responses make room (the oldest go), files and results do not.
            num_bytes = stored_bytes(db, is_responses_counted=False)
            if num_bytes + len(content) > self.max_bytes:
                raise APIError(
                    f"The store holds {num_bytes} bytes of files and batch results; this file's {len(content)} "
                    f"would pass its bound of {self.max_bytes} (--store-max-size): delete files or batches first.",
                    param="file", code="store_full",
                )
            db.execute("INSERT INTO batch_files (id, object, content, owner) VALUES (?, ?, ?, ?)",
                       (file["id"], json.dumps(file), content, self.owner))
        return file

    def file(self, file_id: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute("SELECT object FROM batch_files WHERE id = ? AND owner = ?", (file_id, self.owner)).fetchone()
        return None if row is None or _is_expired(row[0]) else dict(json.loads(row[0]))

    def file_content(self, file_id: str) -> bytes | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT object, content FROM batch_files WHERE id = ? AND owner = ?", (file_id, self.owner)
            ).fetchone()
        return None if row is None or _is_expired(row[0]) else bytes(row[1])

    def files(
        self, purpose: str | None = None, after: str | None = None, limit: int = 10_000, order: str = "desc"
    ) -> tuple[list[dict[str, Any]], bool]:
        """Up to `limit` files not expired (of one purpose when given), newest first unless `order` is
        "asc", from the one after `after`; and whether more follow."""
        is_ascending = order == "asc"
        with self._connect() as db:
            start = db.execute("SELECT seq FROM batch_files WHERE id = ?", (after,)).fetchone() if after else None
            bound = start[0] if start else (0 if is_ascending else 2**62)
            rows = db.execute(
                f"SELECT object FROM batch_files WHERE owner = ? AND seq {'>' if is_ascending else '<'} ? "
                f"ORDER BY seq {'ASC' if is_ascending else 'DESC'}", (self.owner, bound),
            ).fetchall()
        files = [json.loads(text) for (text,) in rows if not _is_expired(text)]
        files = [file for file in files if purpose is None or file["purpose"] == purpose]
        return files[:limit], len(files) > limit

    def delete_file(self, file_id: str) -> bool:
        with self._connect() as db:
            return db.execute("DELETE FROM batch_files WHERE id = ? AND owner = ?", (file_id, self.owner)).rowcount > 0

    # Batches.

    def add_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        with self._connect() as db:
            db.execute("INSERT INTO batch_batches (id, status, object, owner) VALUES (?, ?, ?, ?)",
                       (batch["id"], batch["status"], json.dumps(batch), self.owner))
        return self._with_counts(batch)

    def batch(self, batch_id: str) -> dict[str, Any] | None:
        with self._connect() as db:
            row = db.execute(
                "SELECT object FROM batch_batches WHERE id = ? AND owner = ?", (batch_id, self.owner)
            ).fetchone()
        return None if row is None else self._with_counts(json.loads(row[0]))

    def batches(self, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """Up to `limit` batches, newest first, from the one after `after`; and whether more follow."""
        with self._connect() as db:
            start = db.execute("SELECT seq FROM batch_batches WHERE id = ?", (after,)).fetchone() if after else None
            rows = db.execute(
                "SELECT object FROM batch_batches WHERE owner = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                (self.owner, start[0] if start else 2**62, limit + 1),
            ).fetchall()
        return [self._with_counts(json.loads(row[0])) for row in rows[:limit]], len(rows) > limit

    def next_unfinished(self) -> dict[str, Any] | None:
        """The owner's oldest batch not yet completed, expired, cancelled or failed."""
        if not self._has_schema and not self._has_batches_table():
            return None  # NOTE: no batch yet; the worker's polls make no file and no table.
        marks = ", ".join("?" * len(UNFINISHED_STATUSES))
        with self._connect() as db:
            row = db.execute(
                f"SELECT object FROM batch_batches WHERE owner = ? AND status IN ({marks}) ORDER BY seq LIMIT 1",
                (self.owner, *UNFINISHED_STATUSES),
            ).fetchone()
        return None if row is None else self._with_counts(json.loads(row[0]))

    def update_batch(
        self, batch_id: str, changes: dict[str, Any], only_from: tuple[str, ...] | None = None
    ) -> dict[str, Any] | None:
        """The batch with `changes` made, or None when there is none (or its status is not in `only_from`)."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            batch = self._locked_batch(db, batch_id, only_from)
            if batch is None:
                return None
            batch.update(changes)
            db.execute("UPDATE batch_batches SET status = ?, object = ? WHERE id = ?",
                       (batch["status"], json.dumps(batch), batch_id))
        return self._with_counts(batch)

    def _locked_batch(
        self, db: sqlite3.Connection, batch_id: str, only_from: tuple[str, ...] | None
    ) -> dict[str, Any] | None:
        """The owner's batch read in a write transaction, or None (none, or its status not in `only_from`)."""
        row = db.execute(
            "SELECT object FROM batch_batches WHERE id = ? AND owner = ?", (batch_id, self.owner)
        ).fetchone()
        if row is None:
            return None
        batch: dict[str, Any] = json.loads(row[0])
        return None if only_from is not None and batch["status"] not in only_from else batch

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

    def finish_batch(
        self, batch_id: str, changes: dict[str, Any], only_from: tuple[str, ...] | None = None
    ) -> dict[str, Any] | None:
        """Makes the batch's output and error files (its answered lines in input order, answers in the
        one, errors in the other; none when empty), records them and its counts with `changes` (the
        lines' results, now in the files, are dropped), and forgets the batches finished more than
        MAX_AGE_S ago with their files; in one transaction. None when there is no such batch, or its
        status (a cancel stored meanwhile) is not in `only_from`."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            batch = self._locked_batch(db, batch_id, only_from)
            if batch is None:
                return None
            rows = db.execute(
                "SELECT is_error, result FROM batch_results WHERE batch_id = ? ORDER BY line", (batch_id,)
            ).fetchall()
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
                    db.execute("INSERT INTO batch_files (id, object, content, owner) VALUES (?, ?, ?, ?)",
                               (file["id"], json.dumps(file), content, self.owner))
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


def stored_bytes(db: sqlite3.Connection, is_responses_counted: bool = True) -> int:
    """Bytes the store's files, lines' results and (unless not `is_responses_counted`) kept Responses
    take, of the tables there are."""
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    sums = [
        ("batch_files", "SELECT COALESCE(SUM(LENGTH(content)), 0) FROM batch_files"),
        ("batch_results", "SELECT COALESCE(SUM(LENGTH(result)), 0) FROM batch_results"),
        ("responses", "SELECT COALESCE(SUM(num_bytes), 0) FROM responses"),
    ][:3 if is_responses_counted else 2]
    return sum(int(db.execute(query).fetchone()[0]) for table, query in sums if table in tables)


def _add_owners(db: sqlite3.Connection, owner: str) -> None:
    """Gives a store made before owners (no `owner` column) one: its files and batches become `owner`'s."""
    for table in ("batch_files", "batch_batches"):
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if "owner" not in columns:
            db.execute(f"ALTER TABLE {table} ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
            db.execute(f"UPDATE {table} SET owner = ?", (owner,))


def _is_expired(file_text: str) -> bool:
    expires_at = json.loads(file_text).get("expires_at")
    return expires_at is not None and expires_at <= now()


def _forget_expired_files(db: sqlite3.Connection) -> None:
    """Deletes every owner's expired input files (a finished batch's own files go with the batch)."""
    expired = [(file_id,) for file_id, text in db.execute("SELECT id, object FROM batch_files") if _is_expired(text)]
    db.executemany("DELETE FROM batch_files WHERE id = ?", expired)


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
