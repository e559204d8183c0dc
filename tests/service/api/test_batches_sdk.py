"""The Batch API end to end with OpenAI's SDK against a real tiny-model server: 200 requests, the
server stopped and started again in the middle, every line answered exactly once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from openai.types import Batch

from tests.server_process import ServerProcess, running_server

NUM_LINES = 200
POLL_S = 0.2
# NOTE: only ends a hang, generously: a shared CI machine may run several times slower than a quiet one.
MAX_POLLS = 3000


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def until(sdk: openai.OpenAI, batch_id: str, is_done: Callable[[Batch], bool]) -> Batch:
    """The batch once `is_done(batch)` holds, polled as a client would."""
    for _ in range(MAX_POLLS):
        batch = sdk.batches.retrieve(batch_id)
        if is_done(batch):
            return batch
        time.sleep(POLL_S)
    raise AssertionError(f"the batch never got there: {batch}")


def test_a_batch_of_200_completes_across_a_restart_with_every_line_answered_once(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    lines = [
        {"custom_id": f"request-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "tiny", "messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": 8,
                  "ignore_eos": True}}
        for i in range(NUM_LINES)
    ]
    input_path = tmp_path / "requests.jsonl"
    input_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    # NOTE: the restarted server listens on another free port: the owner name it keeps is given, not its port's.
    store = ("--responses-store", str(tmp_path / "store.sqlite"), "--served-model-name", "tiny", "--store-owner", "tiny")
    with running_server(tiny_model_dir, *store) as server, client(server) as sdk:
        with input_path.open("rb") as upload:
            file = sdk.files.create(file=upload, purpose="batch")
        batch = sdk.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert batch.status == "validating" and batch.request_counts is not None
        assert batch.request_counts.total == NUM_LINES
        started = until(sdk, batch.id, lambda b: b.request_counts is not None and b.request_counts.completed > 0)
    assert started.status == "in_progress" and started.request_counts is not None
    assert started.request_counts.completed < NUM_LINES  # NOTE: stopped in the middle.
    with running_server(tiny_model_dir, *store) as server, client(server) as sdk:
        done = until(sdk, batch.id, lambda b: b.status not in ("validating", "in_progress", "finalizing"))
        assert done.status == "completed" and done.error_file_id is None and done.output_file_id is not None
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (NUM_LINES, 0)
        results = [json.loads(line) for line in sdk.files.content(done.output_file_id).text.splitlines()]
        assert [listed.id for listed in sdk.batches.list(limit=5)] == [batch.id]
    assert [r["custom_id"] for r in results] == [line["custom_id"] for line in lines]
    for result in results:
        body = result["response"]["body"]
        assert result["response"]["status_code"] == 200 and result["error"] is None
        assert body["object"] == "chat.completion" and body["model"] == "tiny"
        assert body["usage"]["completion_tokens"] == 8


def test_two_servers_with_default_settings_keep_to_their_own_batches_and_background_responses(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # NOTE: default settings: both servers keep their store in the one default file, ZEROSERVE_CACHE/responses.sqlite.
    monkeypatch.delenv("ZEROSERVE_RESPONSES_STORE", raising=False)
    monkeypatch.setenv("ZEROSERVE_CACHE", str(tmp_path / "cache"))
    lines = [
        {"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": 8, "ignore_eos": True}
         | ({"model": "first-name"} if i % 2 else {})}
        for i in range(12)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with running_server(tiny_model_dir, "--served-model-name", "first-name") as first, client(first) as sdk:
        with running_server(tiny_model_dir, "--served-model-name", "other-name"):
            file = sdk.files.create(file=("requests.jsonl", content), purpose="batch")
            batch = sdk.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")
            background = sdk.responses.create(
                model="first-name", input="Tell me a long story.", background=True, max_output_tokens=1900,
                extra_body={"ignore_eos": True},
            )
        # NOTE: the other server starts again while the background response runs on the first.
        with running_server(tiny_model_dir, "--served-model-name", "other-name", wait_healthy=False):
            done = until(sdk, batch.id, lambda b: b.status not in ("validating", "in_progress", "finalizing"))
            for _ in range(MAX_POLLS):
                answered = sdk.responses.retrieve(background.id)
                if answered.status not in ("queued", "in_progress"):
                    break
                time.sleep(POLL_S)
        assert done.status == "completed" and done.request_counts is not None, done
        assert (done.request_counts.completed, done.request_counts.failed) == (12, 0)
        assert done.output_file_id is not None
        results = [json.loads(line) for line in sdk.files.content(done.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in results) == sorted(line["custom_id"] for line in lines)
    assert {r["response"]["body"]["model"] for r in results} == {"first-name"}
    assert answered.status == "incomplete" and answered.error is None and answered.usage is not None
    assert answered.usage.output_tokens == 1900
