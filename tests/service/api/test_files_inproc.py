"""Uploads to /v1/files in process, bounded by --max-upload-bytes as they arrive: a chunked upload (no
Content-Length) past it is a 413 once the limit is read, and leaves no spooled file behind."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.service.api.openai_error import assert_openai_error
from tests.service.conftest import Serve

LIMIT = 2 * 2**20
CHUNK = 2**18
BOUNDARY = "zeroserve-test-boundary"
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def open_temp_files(folder: Path) -> list[str]:
    """This process's open files in `folder`, named or not (a spooled upload's file has no name)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:
            continue  # NOTE: the listing's own descriptor, closed by now.
    return [target for target in targets if target.startswith(str(folder))]


async def test_a_chunked_upload_past_the_limit_is_a_413_and_leaves_nothing_on_disk(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    # NOTE: the form's parser spools a file past 1 MiB to the temporary folder.
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    num_sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal num_sent
        head = (f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n--{BOUNDARY}\r\n'
                'Content-Disposition: form-data; name="file"; filename="in.jsonl"\r\n\r\n').encode()
        chunks = [head, *[LINE * (CHUNK // len(LINE))] * (4 * LIMIT // CHUNK), f"\r\n--{BOUNDARY}--\r\n".encode()]
        for chunk in chunks:
            num_sent += len(chunk)
            yield chunk

    async with serve(responses_store=str(tmp_path / "store.sqlite"), max_upload_bytes=LIMIT) as client:
        response = await client.post(
            "/v1/files", content=body(), headers={"content-type": f"multipart/form-data; boundary={BOUNDARY}"}
        )
        error = assert_openai_error(response, 413, "file")
        assert error["code"] == "file_too_large" and "--max-upload-bytes" in error["message"]
        assert num_sent < LIMIT + 2 * CHUNK
        assert list(spool.iterdir()) == [] and open_temp_files(spool) == []
        assert (await client.get("/v1/files")).json()["data"] == []


async def test_an_upload_within_the_limit_is_kept(serve: Serve, tmp_path: Path) -> None:
    content = LINE * (LIMIT // len(LINE))
    async with serve(responses_store=str(tmp_path / "store.sqlite"), max_upload_bytes=LIMIT) as client:
        kept = await client.post("/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"})
        assert kept.status_code == 200 and kept.json()["bytes"] == len(content)
        over = await client.post("/v1/files", files={"file": ("in.jsonl", content + LINE)}, data={"purpose": "batch"})
        assert_openai_error(over, 413, "file")
