"""Stored Responses in process, on a fake engine, through the official OpenAI SDK and raw HTTP:
previous_response_id continuing a conversation (the same prompt as the conversation sent whole),
GET, DELETE and input_items of a kept response, background responses polled and cancelled, a
store that outlives its server, and the 404s and 400s of each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from service.api.gateway_state import gateway_of
from service.config import GatewayConfig
from service.model_files.tokenizer import Tokenizer
from service.serving.gateway import Gateway
from tests.service.api.fake_engine import FakeEngineClient

RESPONSES = "/v1/responses"
MAX_POLLS = 2000
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def sdk_of(api: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """The OpenAI SDK talking to the app in process through `api`'s transport."""
    return openai.AsyncOpenAI(base_url="http://test/v1", api_key="unused", http_client=api, max_retries=0)


def prompt_text(engine: FakeEngineClient, tokenizer: Tokenizer) -> str:
    return tokenizer.decode(engine.requests[-1].prompt_token_ids, skip_special_tokens=False)


@pytest.fixture
def store_path(tmp_path: Path) -> str:
    return str(tmp_path / "responses.sqlite")


@pytest.fixture
async def api(serve: Any, store_path: str) -> AsyncIterator[httpx.AsyncClient]:
    async with serve(responses_store=store_path) as client:
        yield client


async def finished(api: httpx.AsyncClient, response_id: str) -> dict[str, Any]:
    """The response once GET says it is no longer queued or in progress."""
    for _ in range(MAX_POLLS):
        response = (await api.get(f"{RESPONSES}/{response_id}")).json()
        if response["status"] not in ("queued", "in_progress"):
            return response
        await asyncio.sleep(0.005)
    raise AssertionError(f"{response_id} never finished")


async def test_three_turns_by_previous_response_id_render_the_conversation_sent_whole(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    client = sdk_of(api)
    questions = ["Name a colour.", "Another one?", "And a third?"]
    previous_id = None
    answers = []
    for question in questions:
        response = await client.responses.create(model="fake", instructions="Be brief.", input=question,
                                                 previous_response_id=previous_id, max_output_tokens=4,
                                                 extra_body={"ignore_eos": True})
        assert response.store is True and response.previous_response_id == previous_id
        previous_id = response.id
        answers.append(response.output_text)
    continued = engine.requests[-1].prompt_token_ids

    whole: list[Any] = []
    for question, answer in zip(questions, answers, strict=True):
        whole += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    sent_whole = await client.responses.create(model="fake", instructions="Be brief.", input=whole[:-1],
                                               max_output_tokens=4, extra_body={"ignore_eos": True})
    assert engine.requests[-1].prompt_token_ids == continued
    assert sent_whole.output_text == answers[-1]


async def test_a_function_call_round_trip_continues_from_the_call(
    api: httpx.AsyncClient, engine: FakeEngineClient, tokenizer: Tokenizer
) -> None:
    engine.token_ids = [*tokenizer.encode('{"city": "Oslo"}'), engine.eos_token_id]
    client = sdk_of(api)
    called = await client.responses.create(model="fake", input="Weather in Oslo?", tools=[WEATHER],  # type: ignore[list-item]
                                           tool_choice={"type": "function", "name": "get_weather"})
    (call,) = called.output
    assert call.type == "function_call"
    engine.token_ids = [*tokenizer.encode("Snowing."), engine.eos_token_id]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "-3 C, snow"}
    answered = await client.responses.create(model="fake", tools=[WEATHER], previous_response_id=called.id,  # type: ignore[list-item]
                                             input=[output])  # type: ignore[list-item]
    assert answered.output_text == "Snowing."
    continued = prompt_text(engine, tokenizer)
    assert "Weather in Oslo?" in continued and "-3 C, snow" in continued

    whole = [{"role": "user", "content": "Weather in Oslo?"},
             {"type": "function_call", "call_id": call.call_id, "name": "get_weather", "arguments": call.arguments},
             output]
    await client.responses.create(model="fake", tools=[WEATHER], input=whole)  # type: ignore[list-item]
    assert prompt_text(engine, tokenizer) == continued


async def test_a_kept_response_is_got_listed_and_deleted(api: httpx.AsyncClient) -> None:
    client = sdk_of(api)
    first = await client.responses.create(model="fake", input="Hi", max_output_tokens=3)
    second = await client.responses.create(model="fake", input=[{"role": "user", "content": "More"}],
                                           previous_response_id=first.id, max_output_tokens=3)
    got = await client.responses.retrieve(second.id)
    assert got.model_dump() == second.model_dump()

    items = await client.responses.input_items.list(second.id, order="asc")
    assert [item.type for item in items.data] == ["message", "message", "message"]
    roles_and_texts = [(item.role, item.content[0].text) for item in items.data]  # type: ignore[union-attr]
    assert roles_and_texts == [("user", "Hi"), ("assistant", first.output_text), ("user", "More")]
    assert items.data[1].id == first.output[0].id
    newest = (await api.get(f"{RESPONSES}/{second.id}/input_items", params={"limit": 2})).json()
    assert [item["id"] for item in newest["data"]] == [items.data[2].id, items.data[1].id]
    assert newest["object"] == "list" and newest["has_more"] is True and newest["last_id"] == items.data[1].id
    rest = (await api.get(f"{RESPONSES}/{second.id}/input_items", params={"after": newest["last_id"]})).json()
    assert [item["id"] for item in rest["data"]] == [items.data[0].id] and rest["has_more"] is False

    await client.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(second.id)
    assert (await client.responses.retrieve(first.id)).id == first.id


async def test_a_stream_is_kept_before_its_last_event(api: httpx.AsyncClient) -> None:
    client = sdk_of(api)
    stream = await client.responses.create(model="fake", input="Hi", max_output_tokens=3, stream=True)
    kept_texts = []
    async for event in stream:
        if event.type == "response.incomplete":
            kept = (await api.get(f"{RESPONSES}/{event.response.id}")).json()
            kept_texts.append(kept["output"][0]["content"][0]["text"])
            assert kept_texts == [event.response.output_text]
    assert len(kept_texts) == 1


async def test_store_false_keeps_nothing(api: httpx.AsyncClient) -> None:
    response = (await api.post(RESPONSES, json={"input": "Hi", "store": False, "max_output_tokens": 2})).json()
    assert response["store"] is False
    assert (await api.get(f"{RESPONSES}/{response['id']}")).status_code == 404
    continued = await api.post(RESPONSES, json={"input": "Hi", "previous_response_id": response["id"]})
    assert continued.status_code == 404 and continued.json()["error"]["param"] == "previous_response_id"


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/v1/responses/resp_nope"), ("DELETE", "/v1/responses/resp_nope"),
    ("GET", "/v1/responses/resp_nope/input_items"), ("POST", "/v1/responses/resp_nope/cancel"),
])
async def test_an_unknown_id_is_a_404_in_openais_shape(api: httpx.AsyncClient, method: str, path: str) -> None:
    response = await api.request(method, path)
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "resp_nope" in error["message"]


async def test_bad_list_queries_get_a_400_naming_them(api: httpx.AsyncClient) -> None:
    kept = (await api.post(RESPONSES, json={"input": "Hi", "max_output_tokens": 2})).json()
    for query, param in (({"limit": 0}, "limit"), ({"order": "up"}, "order"), ({"after": "msg_nope"}, "after")):
        response = await api.get(f"{RESPONSES}/{kept['id']}/input_items", params=query)
        assert response.status_code == 400 and response.json()["error"]["param"] == param


async def test_a_background_response_is_polled_until_it_completes(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    queued = await sdk_of(api).responses.create(model="fake", input="Hi", background=True, max_output_tokens=5,
                                                extra_body={"ignore_eos": True})
    assert queued.status == "queued" and queued.background is True and queued.output == []
    done = await finished(api, queued.id)
    assert done["status"] == "incomplete" and done["output"][0]["content"][0]["text"] == engine.output_text(5)
    assert done["usage"]["output_tokens"] == 5
    again = (await api.post(f"{RESPONSES}/{queued.id}/cancel")).json()
    assert again["status"] == "incomplete"


async def test_cancel_ends_a_background_response_and_its_engine_request(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.seconds_per_step = 0.05
    client = sdk_of(api)
    queued = await client.responses.create(model="fake", input="Hi", background=True, max_output_tokens=1000,
                                           extra_body={"ignore_eos": True})
    for _ in range(MAX_POLLS):
        if engine.running_ids:
            break
        await asyncio.sleep(0.005)
    cancelled = await client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert engine.running_ids == [] and len(engine.aborted_ids) == 1
    assert (await client.responses.retrieve(queued.id)).status == "cancelled"

    not_background = (await api.post(RESPONSES, json={"input": "Hi", "max_output_tokens": 1})).json()
    refused = await api.post(f"{RESPONSES}/{not_background['id']}/cancel")
    assert refused.status_code == 400 and "background" in refused.json()["error"]["message"]


async def test_a_continued_turn_waits_for_a_background_response_to_finish(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.seconds_per_step = 0.05
    queued = (await api.post(RESPONSES, json={"input": "Hi", "background": True, "max_output_tokens": 1000,
                                               "ignore_eos": True})).json()
    early = await api.post(RESPONSES, json={"input": "More", "previous_response_id": queued["id"]})
    assert early.status_code == 400 and "has not finished" in early.json()["error"]["message"]
    assert (await api.delete(f"{RESPONSES}/{queued['id']}")).json()["deleted"] is True
    assert engine.running_ids == []


async def test_a_restarted_server_continues_from_the_store(
    serve: Any, store_path: str, engine: FakeEngineClient
) -> None:
    async with serve(responses_store=store_path) as api:
        first = (await api.post(RESPONSES, json={"input": "Hi", "max_output_tokens": 3})).json()
    async with serve(responses_store=store_path) as api:
        assert (await api.get(f"{RESPONSES}/{first['id']}")).json() == first
        continued = await api.post(RESPONSES, json={"input": "More", "previous_response_id": first["id"]})
        assert continued.status_code == 200, continued.text
    assert first["output"][0]["content"][0]["text"] in engine.tokenizer.decode(engine.requests[-1].prompt_token_ids)


async def test_a_background_response_a_stopped_server_left_is_failed_when_it_starts(
    serve: Any, store_path: str, engine: FakeEngineClient
) -> None:
    engine.seconds_per_step = 0.05
    async with serve(responses_store=store_path) as api:
        queued = (await api.post(RESPONSES, json={"input": "Hi", "background": True, "max_output_tokens": 1000,
                                                   "ignore_eos": True})).json()
        # NOTE: a stopped process's task ends with it; this one is ended by hand, the store left as it was.
        tasks = list(gateway_of(api._transport.app).background.running.values())  # type: ignore[attr-defined]
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
    engine.seconds_per_step = 0.0
    async with serve(responses_store=store_path) as api:
        failed = (await api.get(f"{RESPONSES}/{queued['id']}")).json()
        assert failed["status"] == "failed" and "stopped" in failed["error"]["message"]
        continued = await api.post(RESPONSES, json={"input": "More", "previous_response_id": queued["id"],
                                                     "max_output_tokens": 2})
        assert continued.status_code == 200, continued.text


async def test_a_server_with_the_store_off_says_so(serve: Any) -> None:
    async with serve(responses_store="off") as api:
        plain = (await api.post(RESPONSES, json={"input": "Hi", "max_output_tokens": 2})).json()
        assert plain["store"] is False
        for body, param in (({"store": True}, "store"), ({"previous_response_id": plain["id"]}, "previous_response_id"),
                            ({"background": True}, "background")):
            response = await api.post(RESPONSES, json={"input": "Hi", **body})
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["param"] == param and "--responses-store off" in error["message"], error
        missing = await api.get(f"{RESPONSES}/{plain['id']}")
        assert missing.status_code == 404 and "--responses-store off" in json.dumps(missing.json())


async def test_another_server_starting_on_the_store_leaves_a_background_response_running(
    api: httpx.AsyncClient, store_path: str, engine: FakeEngineClient
) -> None:
    engine.seconds_per_step = 0.01
    queued = (await api.post(RESPONSES, json={"input": "Hi", "background": True, "max_output_tokens": 30,
                                               "ignore_eos": True})).json()
    for _ in range(2):  # NOTE: a second server on the same store starts, and restarts.
        Gateway(GatewayConfig(model="other", port=8001, responses_store=store_path))
    assert (await api.get(f"{RESPONSES}/{queued['id']}")).json()["status"] in ("queued", "in_progress")
    done = await finished(api, queued["id"])
    assert done["status"] == "incomplete" and done["error"] is None and done["usage"]["output_tokens"] == 30


async def test_a_request_id_that_is_kept_already_is_refused_not_replaced(api: httpx.AsyncClient) -> None:
    first = await api.post(RESPONSES, json={"input": "Hi", "max_output_tokens": 2, "request_id": "job-1"})
    assert first.status_code == 200 and first.json()["id"] == "resp_job-1"
    again = await api.post(RESPONSES, json={"input": "Other", "max_output_tokens": 3, "request_id": "job-1"})
    assert again.status_code == 400 and again.json()["error"]["param"] == "request_id", again.text
    assert (await api.get(f"{RESPONSES}/resp_job-1")).json() == first.json()
