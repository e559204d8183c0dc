"""Responses kept for `store: true` (what `previous_response_id`, GET and DELETE /v1/responses/{id}
read): each Response object with the input items it answered, in one SQLite file that a restarted
server (and every gateway process of one server) opens again, within an age and a size bound.

A response is added once (an id that is kept already is refused, never replaced) and then only moves
on from queued or in progress: a cancel or a delete stored by one gateway process is not undone by
another finishing the answer. Each response records its owner (--store-owner), and a starting server
fails only its own unfinished background responses, never those of another server on the same file."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proto.envs import cache_dir
from service.openai.batch_store import stored_bytes

OFF = "off"
DEFAULT_FILE_NAME = "responses.sqlite"
# NOTE: OpenAI keeps stored responses 30 days; a local server's disk sets the other bound.
DEFAULT_MAX_AGE_S = 30 * 24 * 3600.0
DEFAULT_MAX_BYTES = 2**30

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    stored_at REAL NOT NULL,
    num_bytes INTEGER NOT NULL,
    response TEXT NOT NULL,
    input_items TEXT NOT NULL,
    owner TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS responses_by_age ON responses (stored_at);
CREATE INDEX IF NOT EXISTS responses_by_status ON responses (json_extract(response, '$.status'));
"""
# The statuses of a response still being answered (a background one).
UNFINISHED = ("queued", "in_progress")


class ResponseExistsError(ValueError):
    """A response of this id is kept already (a `request_id` sent again)."""


def store_path(setting: str) -> Path | None:
    """Where --responses-store keeps responses: its path, ZEROSERVE_CACHE/responses.sqlite when
    empty, None when "off"."""
    if setting.strip().lower() == OFF:
        return None
    return Path(setting).expanduser() if setting.strip() else cache_dir() / DEFAULT_FILE_NAME


@dataclass(frozen=True)
class StoredResponse:
    """A kept Response object and the input items it answered (those of its previous responses first)."""

    response: dict[str, Any]
    input_items: list[dict[str, Any]]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """The items a response continuing from this one starts with: its input, then its output."""
        return [*self.input_items, *self.response["output"]]


class ResponseStore:
    """Responses in one SQLite file. Each method opens its own connection and blocks on the disk:
    callers on the event loop run them in a thread (`asyncio.to_thread`)."""

    def __init__(
        self, path: Path, max_age_s: float = DEFAULT_MAX_AGE_S, max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.time, owner: str = "",
    ) -> None:
        self.path = path
        self.owner = owner
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self.clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as connection:
            # NOTE: WAL lets readers go on while one gateway process writes (--api-server-count shares the file).
            connection.execute("PRAGMA journal_mode=WAL")
            connection.executescript(_SCHEMA)
            columns = {row[1] for row in connection.execute("PRAGMA table_info(responses)")}
            if "owner" not in columns:  # NOTE: a store made before owners; its responses become this server's.
                connection.execute("ALTER TABLE responses ADD COLUMN owner TEXT NOT NULL DEFAULT ''")
                connection.execute("UPDATE responses SET owner = ?", (owner,))

    def add(self, response: dict[str, Any], input_items: list[dict[str, Any]]) -> None:
        """Keeps a new response, then drops what is past the bounds, oldest first; ResponseExistsError
        when its id is kept already."""
        response_text, items_text = json.dumps(response), json.dumps(input_items)
        with self._connection() as connection:
            try:
                connection.execute(
                    "INSERT INTO responses (id, stored_at, num_bytes, response, input_items, owner) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (response["id"], self.clock(), len(response_text) + len(items_text), response_text, items_text,
                     self.owner),
                )
            except sqlite3.IntegrityError as exc:
                raise ResponseExistsError(f"a response with id {response['id']!r} is kept already") from exc
            self._prune(connection)

    def update(self, response: dict[str, Any]) -> bool:
        """Replaces a kept response that is still queued or in progress (a background one moving on);
        False when it is gone or has ended (cancelled, deleted), which then stays as it is."""
        response_text = json.dumps(response)
        with self._connection() as connection:
            return connection.execute(
                "UPDATE responses SET num_bytes = num_bytes - LENGTH(response) + ?, response = ? "
                "WHERE id = ? AND json_extract(response, '$.status') IN (?, ?)",
                (len(response_text), response_text, response["id"], *UNFINISHED),
            ).rowcount > 0

    def exists(self, response_id: str) -> bool:
        with self._connection() as connection:
            return connection.execute("SELECT 1 FROM responses WHERE id = ?", (response_id,)).fetchone() is not None

    def get(self, response_id: str) -> StoredResponse | None:
        with self._connection() as connection:
            row = connection.execute(
                "SELECT response, input_items FROM responses WHERE id = ? AND stored_at >= ?",
                (response_id, self.clock() - self.max_age_s),
            ).fetchone()
        return None if row is None else StoredResponse(json.loads(row[0]), json.loads(row[1]))

    def delete(self, response_id: str) -> bool:
        """Whether there was such a response to delete."""
        with self._connection() as connection:
            return connection.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount > 0

    def fail_unfinished(self, message: str) -> int:
        """Marks every response of this owner still queued or in progress failed (with `message`); how
        many there were."""
        error = json.dumps({"code": "server_error", "message": message})
        with self._connection() as connection:
            return connection.execute(
                "UPDATE responses SET response = json_set(response, '$.status', 'failed', '$.error', json(?)) "
                "WHERE owner = ? AND json_extract(response, '$.status') IN (?, ?)", (error, self.owner, *UNFINISHED),
            ).rowcount

    def _prune(self, connection: sqlite3.Connection) -> None:
        connection.execute("DELETE FROM responses WHERE stored_at < ?", (self.clock() - self.max_age_s,))
        # NOTE: the Batch API's files and results share the bound; they are not dropped, kept responses are.
        total = stored_bytes(connection)
        if total <= self.max_bytes:
            return
        dropped = []
        for response_id, num_bytes in connection.execute("SELECT id, num_bytes FROM responses ORDER BY stored_at"):
            if total <= self.max_bytes:
                break
            dropped.append((response_id,))
            total -= num_bytes
        connection.executemany("DELETE FROM responses WHERE id = ?", dropped)

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """A connection whose changes are committed when the block ends without error."""
        # NOTE: another gateway process may hold the write lock for a moment; wait for it, not fail.
        connection = sqlite3.connect(self.path, timeout=30.0)
        try:
            with connection:
                yield connection
        finally:
            connection.close()


def open_store(setting: str, owner: str, max_bytes: int = DEFAULT_MAX_BYTES) -> ResponseStore | None:
    """The store --responses-store names (None: responses are not kept), as a starting server of
    `owner` finds it: a background response it was answering when it stopped ended with it, and is failed."""
    path = store_path(setting)
    if path is None:
        return None
    store = ResponseStore(path, max_bytes=max_bytes, owner=owner)
    # NOTE: every gateway process opens the store as the server starts, before any serves a request.
    store.fail_unfinished("The server stopped before this response finished.")
    return store
