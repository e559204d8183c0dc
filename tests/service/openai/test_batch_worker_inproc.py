"""The batch worker in process on the fake engine: a batch past its window expires keeping what was
answered, a line runs at most --request-timeout, a line's own failure is its result, an engine that
keeps failing fails the batch after a few tries, and a cancel stored meanwhile is never undone."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from service.client.core_client import EngineDeadError
from service.model_files.tokenizer import Tokenizer
from service.openai import batch_worker
from service.openai.batch_generate import BatchLine
from service.openai.batch_store import BatchStore
from tests.service.api.batch_client import CHAT, chat_line, create_batch, file_lines, until_status, upload
from tests.service.api.fake_engine import FakeEngineClient
from tests.service.conftest import Serve

OWNER = "port 8000"  # NOTE: the serve fixture's server, on GatewayConfig's default port.


@pytest.fixture
def engine(tokenizer: Tokenizer) -> FakeEngineClient:
    """A fake engine whose steps take 5 ms, so that a long line runs for a while."""
    return FakeEngineClient(tokenizer, seconds_per_step=0.005)


def left_batch(store: BatchStore, names: list[str], expires_at: int) -> dict[str, Any]:
    """A batch a stopped server left in the store, with its window ending at `expires_at`."""
    file = store.add_file("in.jsonl", "batch", "".join(chat_line(name) + "\n" for name in names).encode())
    return store.add_batch({
        "id": "batch_late", "object": "batch", "endpoint": CHAT, "input_file_id": file["id"], "status": "in_progress",
        "expires_at": expires_at, "request_counts": {"total": len(names), "completed": 0, "failed": 0},
    })


async def test_a_batch_past_its_window_expires_keeping_the_lines_answered(serve: Serve, tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "store.sqlite", owner=OWNER)
    left_batch(store, ["done", "late-1", "late-2"], expires_at=int(time.time()) - 1)
    store.add_result("batch_late", 0, {"custom_id": "done", "response": {"status_code": 200}}, is_error=False)
    async with serve(responses_store=str(store.path)) as client:
        expired = await until_status(client, "batch_late", {"expired", "completed"})
        assert expired["status"] == "expired" and expired["expired_at"] is not None
        assert expired["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
        assert [a["custom_id"] for a in await file_lines(client, expired["output_file_id"])] == ["done"]
        errors = await file_lines(client, expired["error_file_id"])
    assert [(e["custom_id"], e["response"], e["error"]["code"]) for e in errors] == [
        ("late-1", None, "batch_expired"), ("late-2", None, "batch_expired"),
    ]


async def test_a_line_runs_at_most_the_request_timeout(serve: Serve, tmp_path: Path) -> None:
    async with serve(responses_store=str(tmp_path / "store.sqlite"), request_timeout_s=0.5) as client:
        file = await upload(client, [chat_line("short", 2), chat_line("long", 2000)])
        done = await until_status(client, (await create_batch(client, file["id"])).json()["id"], {"completed"})
        assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
        (error,) = await file_lines(client, done["error_file_id"])
    assert error["custom_id"] == "long" and error["response"]["status_code"] == 408
    assert "--request-timeout" in error["response"]["body"]["error"]["message"]


async def test_a_line_that_fails_on_its_own_is_its_result_and_the_batch_goes_on(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer_result = batch_worker.answer_result

    def failing_answer(line: BatchLine, *args: Any) -> dict[str, Any]:
        if line.custom_id == "broken":
            raise ValueError("a fault of this line's")
        return answer_result(line, *args)

    monkeypatch.setattr(batch_worker, "answer_result", failing_answer)
    async with serve(responses_store=str(tmp_path / "store.sqlite")) as client:
        file = await upload(client, [chat_line("fine"), chat_line("broken"), chat_line("also-fine")])
        done = await until_status(client, (await create_batch(client, file["id"])).json()["id"], {"completed", "failed"})
        assert done["status"] == "completed" and done["request_counts"]["failed"] == 1
        (error,) = await file_lines(client, done["error_file_id"])
    assert error["custom_id"] == "broken" and error["response"]["status_code"] == 500
    assert "a fault of this line's" in error["response"]["body"]["error"]["message"]


async def test_a_batch_whose_engine_keeps_failing_ends_failed_after_a_few_tries(
    serve: Serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    num_calls = 0

    async def dead_collect(outputs: Any, num_prompts: int, n: int) -> Any:
        nonlocal num_calls
        num_calls += 1
        await outputs.aclose()
        raise EngineDeadError("the engine is gone")

    monkeypatch.setattr(batch_worker, "collect", dead_collect)
    monkeypatch.setattr(batch_worker, "RETRY_S", 0.01)
    async with serve(responses_store=str(tmp_path / "store.sqlite")) as client:
        file = await upload(client, [chat_line("a")])
        failed = await until_status(client, (await create_batch(client, file["id"])).json()["id"], {"failed"})
    assert num_calls == batch_worker.MAX_ATTEMPTS
    (error,) = failed["errors"]["data"]
    assert error["code"] == "batch_failed" and "the engine is gone" in error["message"]


def test_a_cancel_stored_meanwhile_is_not_undone_by_the_batch_finishing(tmp_path: Path) -> None:
    store = BatchStore(tmp_path / "store.sqlite", owner=OWNER)
    left_batch(store, ["a"], expires_at=int(time.time()) + 3600)
    store.update_batch("batch_late", {"status": "finalizing"})
    # NOTE: another gateway process of the server stores a cancel first.
    assert BatchStore(store.path, owner=OWNER).update_batch("batch_late", {"status": "cancelling"}) is not None
    assert store.finish_batch("batch_late", {"status": "completed"}, only_from=("finalizing",)) is None
    assert store.batch("batch_late")["status"] == "cancelling"  # type: ignore[index]
    assert BatchStore(store.path, owner="port 8001").batch("batch_late") is None
