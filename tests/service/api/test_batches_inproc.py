"""The Files and Batch APIs in process on the fake engine: shapes, errors, a bad line in the error
file, cancel, and a batch continued by a new server on the same store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.model_files.tokenizer import Tokenizer
from service.openai.batch_store import BatchStore
from service.openai.batch_worker import POLL_S
from tests.service.api.batch_client import CHAT, MAX_POLLS, chat_line, create_batch, file_lines, until_status, upload
from tests.service.api.fake_engine import SENTENCE, FakeEngineClient
from tests.service.conftest import Serve


@pytest.fixture
def engine(tokenizer: Tokenizer) -> FakeEngineClient:
    """A fake engine whose steps take 5 ms, so that a long line still runs when a test cancels it."""
    return FakeEngineClient(tokenizer, seconds_per_step=0.005)


@pytest.fixture
async def api(serve: Serve, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    """The app in process, keeping its files and batches in the test's own store."""
    async with serve(responses_store=str(tmp_path / "store.sqlite")) as client:
        yield client


async def test_a_file_is_kept_listed_read_back_and_deleted(api: httpx.AsyncClient) -> None:
    file = await upload(api, [chat_line("a")])
    assert file["object"] == "file" and file["purpose"] == "batch" and file["filename"] == "in.jsonl"
    assert file["bytes"] == len(chat_line("a")) + 1
    assert (await api.get(f"/v1/files/{file['id']}")).json() == file
    assert (await api.get(f"/v1/files/{file['id']}/content")).text == chat_line("a") + "\n"
    assert [f["id"] for f in (await api.get("/v1/files")).json()["data"]] == [file["id"]]
    deleted = await api.delete(f"/v1/files/{file['id']}")
    assert deleted.json() == {"id": file["id"], "object": "file", "deleted": True}
    for path in (f"/v1/files/{file['id']}", f"/v1/files/{file['id']}/content"):
        missing = await api.get(path)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"


async def test_an_upload_names_what_is_wrong(api: httpx.AsyncClient) -> None:
    wrong_purpose = await api.post("/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "fine-tune"})
    assert wrong_purpose.status_code == 400 and wrong_purpose.json()["error"]["param"] == "purpose"
    no_file = await api.post("/v1/files", files={"other": ("a.jsonl", b"{}\n")}, data={"purpose": "batch"})
    assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
    not_text = await api.post("/v1/files", files={"file": ("a.jsonl", b"\xff\xfe")}, data={"purpose": "batch"})
    assert not_text.status_code == 400 and "UTF-8" in not_text.json()["error"]["message"]
    as_json = await api.post("/v1/files", json={"purpose": "batch"})
    assert as_json.status_code == 415


async def test_a_batch_answers_every_line_with_bad_lines_in_the_error_file(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    lines = [
        chat_line("first"), "not json", chat_line("wrong-url", url="/v1/completions"),
        chat_line("get", method="GET"), chat_line("last", 5),
    ]
    file = await upload(api, lines)
    created = await create_batch(api, file["id"], metadata={"job": "nightly"})
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["object"] == "batch" and batch["endpoint"] == CHAT and batch["metadata"] == {"job": "nightly"}
    assert batch["request_counts"] == {"total": 5, "completed": 0, "failed": 0}
    done = await until_status(api, batch["id"], {"completed"})
    assert done["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
    assert done["in_progress_at"] is not None and done["completed_at"] is not None
    answers = await file_lines(api, done["output_file_id"])
    assert [a["custom_id"] for a in answers] == ["first", "last"]
    assert all(a["response"]["status_code"] == 200 and a["error"] is None for a in answers)
    last = answers[1]["response"]["body"]
    assert last["object"] == "chat.completion" and last["usage"]["completion_tokens"] == 5
    assert last["choices"][0]["message"]["content"] == engine.output_text(5)
    errors = await file_lines(api, done["error_file_id"])
    assert [e["custom_id"] for e in errors] == [None, "wrong-url", "get"]
    # NOTE: OpenAI's error lines: a line that is no request has `error` alone, a refused request its answer.
    assert errors[0]["response"] is None and errors[0]["error"]["code"] == "invalid_json_line"
    assert "not valid JSON" in errors[0]["error"]["message"]
    assert [e["error"] for e in errors[1:]] == [None, None]
    assert [e["response"]["status_code"] for e in errors[1:]] == [400, 400]
    assert [e["response"]["body"]["error"]["param"] for e in errors[1:]] == ["url", "method"]
    # NOTE: batch lines yield to interactive requests under --scheduling-policy priority.
    assert {request.priority for request in engine.requests} == {1}


async def test_batches_are_listed_newest_first_a_page_at_a_time(api: httpx.AsyncClient) -> None:
    file = await upload(api, [chat_line("a")])
    ids = [(await create_batch(api, file["id"])).json()["id"] for _ in range(3)]
    first = (await api.get("/v1/batches", params={"limit": 2})).json()
    assert [b["id"] for b in first["data"]] == ids[:0:-1] and first["has_more"] is True
    assert first["first_id"] == ids[2] and first["last_id"] == ids[1]
    rest = (await api.get("/v1/batches", params={"limit": 2, "after": first["last_id"]})).json()
    assert [b["id"] for b in rest["data"]] == ids[:1] and rest["has_more"] is False


@pytest.mark.parametrize(("changes", "status_code", "param"), [
    ({"input_file_id": "file-missing"}, 404, "file_id"),
    ({"endpoint": "/v1/embeddings"}, 400, "endpoint"),
    ({"completion_window": "1h"}, 400, "completion_window"),
    ({"output_expires_after": {"anchor": "created_at", "seconds": 3600}}, 400, "output_expires_after"),
])
async def test_a_batch_request_names_what_is_wrong(
    api: httpx.AsyncClient, changes: dict[str, Any], status_code: int, param: str
) -> None:
    file = await upload(api, [chat_line("a")])
    response = await create_batch(api, file["id"], **changes)
    assert response.status_code == status_code, response.text
    assert response.json()["error"]["param"] == param


async def test_unknown_batches_are_404_and_a_finished_one_cannot_be_cancelled(api: httpx.AsyncClient) -> None:
    for response in (await api.get("/v1/batches/batch_missing"), await api.post("/v1/batches/batch_missing/cancel")):
        assert response.status_code == 404 and response.json()["error"]["code"] == "batch_not_found"
    file = await upload(api, [chat_line("a")])
    done = await until_status(api, (await create_batch(api, file["id"])).json()["id"], {"completed"})
    refused = await api.post(f"/v1/batches/{done['id']}/cancel")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "batch_not_cancellable"


async def test_a_cancelled_batch_aborts_its_lines_and_keeps_those_answered(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    file = await upload(api, [chat_line("short", 1), chat_line("long", 2000)])
    batch = (await create_batch(api, file["id"])).json()
    for _ in range(MAX_POLLS):
        if (await api.get(f"/v1/batches/{batch['id']}")).json()["request_counts"]["completed"] == 1:
            break
        await asyncio.sleep(0.02)
    cancelling = await api.post(f"/v1/batches/{batch['id']}/cancel")
    assert cancelling.status_code == 200 and cancelling.json()["status"] == "cancelling"
    cancelled = await until_status(api, batch["id"], {"cancelled"})
    assert cancelled["request_counts"] == {"total": 2, "completed": 1, "failed": 0}
    assert cancelled["cancelled_at"] is not None and cancelled["error_file_id"] is None
    assert [a["custom_id"] for a in await file_lines(api, cancelled["output_file_id"])] == ["short"]
    assert len(engine.aborted_ids) == 1


async def test_a_new_server_continues_its_batch_answering_each_line_once_and_no_other_server_touches_it(
    serve: Serve, tmp_path: Path
) -> None:
    path = tmp_path / "store.sqlite"
    store = BatchStore(path, owner="port 8000")  # NOTE: a server on port 8000 stopped mid-batch.
    content = "".join(chat_line(name) + "\n" for name in ("kept", "new")).encode()
    file = store.add_file("in.jsonl", "batch", content)
    batch = {"id": "batch_left", "object": "batch", "endpoint": CHAT, "input_file_id": file["id"],
             "status": "in_progress", "request_counts": {"total": 2, "completed": 0, "failed": 0}}
    store.add_batch(batch)
    store.add_result("batch_left", 0, {"custom_id": "kept", "from": "the first server"}, is_error=False)
    async with serve(responses_store=str(path), port=8001) as other:
        await asyncio.sleep(3 * POLL_S)  # NOTE: its worker polls the store meanwhile.
        for response in (await other.get("/v1/batches/batch_left"), await other.get(f"/v1/files/{file['id']}")):
            assert response.status_code == 404, response.text
        assert (await other.get("/v1/batches")).json()["data"] == []
        assert (await other.post("/v1/batches/batch_left/cancel")).status_code == 404
    assert store.answered_lines("batch_left") == {0} and store.batch("batch_left")["status"] == "in_progress"  # type: ignore[index]
    async with serve(responses_store=str(path), port=8000) as client:
        done = await until_status(client, "batch_left", {"completed"})
        answers = await file_lines(client, done["output_file_id"])
    assert answers[0] == {"custom_id": "kept", "from": "the first server"}
    assert answers[1]["custom_id"] == "new" and SENTENCE.startswith(
        answers[1]["response"]["body"]["choices"][0]["message"]["content"]
    )


async def test_a_batch_with_a_custom_id_twice_fails_at_validation_naming_the_lines(api: httpx.AsyncClient) -> None:
    file = await upload(api, [chat_line("a"), chat_line("b"), "not json", chat_line("a")])
    created = await create_batch(api, file["id"])
    assert created.status_code == 200, created.text
    batch = created.json()
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    (error,) = batch["errors"]["data"]
    assert error["code"] == "duplicate_custom_id" and error["line"] == 4 and "line 1" in error["message"]
    assert (await until_status(api, batch["id"], {"failed"}))["output_file_id"] is None


async def test_files_are_listed_a_page_at_a_time_in_either_order(api: httpx.AsyncClient) -> None:
    ids = [(await upload(api, [chat_line(name)]))["id"] for name in ("a", "b", "c")]
    first = (await api.get("/v1/files", params={"limit": 2})).json()
    assert [f["id"] for f in first["data"]] == ids[:0:-1] and first["has_more"] is True
    rest = (await api.get("/v1/files", params={"limit": 2, "after": first["last_id"]})).json()
    assert [f["id"] for f in rest["data"]] == ids[:1] and rest["has_more"] is False
    ascending = (await api.get("/v1/files", params={"order": "asc", "purpose": "batch"})).json()
    assert [f["id"] for f in ascending["data"]] == ids and ascending["first_id"] == ids[0]
    assert (await api.get("/v1/files", params={"order": "up"})).json()["error"]["param"] == "order"
    assert all(f["expires_at"] == f["created_at"] + 30 * 24 * 3600 for f in ascending["data"])


async def test_with_the_store_off_the_batch_routes_say_so(serve: Serve) -> None:
    async with serve(responses_store="off") as client:
        for response in (await client.get("/v1/batches"), await client.get("/v1/files")):
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "batches_off"
            assert "--responses-store" in response.json()["error"]["message"]
