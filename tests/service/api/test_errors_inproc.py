"""Bad requests to every route, in process on a fake engine: each gets OpenAI's error shape naming
the field at fault, before the engine is sent anything, and the server serves on."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.service.api.fake_engine import MAX_MODEL_LEN, FakeEngineClient
from tests.service.api.openai_error import assert_openai_error

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hello there"}]
TOO_LONG = "hello " * MAX_MODEL_LEN

BAD_REQUESTS: list[tuple[str, Any, int, str | None]] = [
    (CHAT, b"{not json", 400, None),
    (CHAT, b"\xff\xfe", 400, None),
    (CHAT, b"[1, 2]", 400, None),
    (CHAT, {"model": "fake"}, 400, "messages"),
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": [{"content": "hi"}]}, 400, "messages.0.role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content"),
    (CHAT, {"model": "nope", "messages": MESSAGES}, 404, "model"),
    (CHAT, {"messages": MESSAGES, "temperature": -1}, 400, "temperature"),
    (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', 400, "temperature"),
    (CHAT, {"messages": MESSAGES, "temperature": "hot"}, 400, "temperature"),
    (CHAT, {"messages": MESSAGES, "top_p": 0}, 400, "top_p"),
    (CHAT, {"messages": MESSAGES, "top_p": 1.5}, 400, "top_p"),
    (CHAT, {"messages": MESSAGES, "top_k": -2}, 400, "top_k"),
    (CHAT, {"messages": MESSAGES, "min_p": 2}, 400, "min_p"),
    (CHAT, {"messages": MESSAGES, "presence_penalty": 3}, 400, "presence_penalty"),
    (CHAT, {"messages": MESSAGES, "frequency_penalty": -3}, 400, "frequency_penalty"),
    (CHAT, {"messages": MESSAGES, "repetition_penalty": 0}, 400, "repetition_penalty"),
    (CHAT, {"messages": MESSAGES, "logit_bias": {"abc": 1}}, 400, "logit_bias"),
    (CHAT, {"messages": MESSAGES, "logit_bias": {"5": 200}}, 400, "logit_bias"),
    (CHAT, {"messages": MESSAGES, "logit_bias": {"99999999": 1}}, 400, "logit_bias"),
    (CHAT, {"messages": MESSAGES, "seed": 2**70}, 400, "seed"),
    (CHAT, {"messages": MESSAGES, "n": 0}, 400, "n"),
    (CHAT, {"messages": MESSAGES, "n": 17}, 400, "n"),
    (CHAT, {"messages": MESSAGES, "best_of": 2}, 400, "best_of"),
    (CHAT, {"messages": MESSAGES, "max_tokens": 0}, 400, "max_tokens"),
    (CHAT, {"messages": MESSAGES, "max_tokens": 100_000}, 400, "max_tokens"),
    (CHAT, {"messages": MESSAGES, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    (CHAT, {"messages": MESSAGES, "min_tokens": -1}, 400, "min_tokens"),
    (CHAT, {"messages": MESSAGES, "stop": 5}, 400, "stop"),
    (CHAT, {"messages": MESSAGES, "stop_token_ids": [10**9]}, 400, "stop_token_ids"),
    (CHAT, {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    (CHAT, {"messages": MESSAGES, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": MESSAGES, "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    (CHAT, {"messages": MESSAGES, "stream_options": {"include_usage": "maybe"}}, 400,
     "stream_options.include_usage"),
    (CHAT, {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice"),
    (CHAT, {"messages": MESSAGES, "response_format": {"type": "yaml"}}, 400, "response_format"),
    (CHAT, {"messages": MESSAGES, "response_format": {"type": "json_schema"}}, 400, "response_format"),
    (CHAT, {"messages": MESSAGES, "continue_final_message": True}, 400, "continue_final_message"),
    (CHAT, {"messages": MESSAGES, "continue_final_message": True, "add_generation_prompt": False}, 400,
     "continue_final_message"),
    (CHAT, {"messages": MESSAGES, "data_parallel_rank": -1}, 400, "data_parallel_rank"),
    (CHAT, {"messages": MESSAGES, "data_parallel_rank": 1}, 400, "data_parallel_rank"),
    (CHAT, {"messages": MESSAGES, "temperature": -1, "stream": True}, 400, "temperature"),
    (COMPLETIONS, {"max_tokens": 3}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt"),
    (COMPLETIONS, {"prompt": []}, 400, "prompt"),
    (COMPLETIONS, {"prompt": ["ok", ""]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [[]]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": [10**9]}, 400, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "model": "nope"}, 404, "model"),
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 3000}, 400, "max_tokens"),
    (COMPLETIONS, {"prompt": "hi", "suffix": "x"}, 400, "suffix"),
    (COMPLETIONS, {"prompt": "hi", "best_of": 3}, 400, "best_of"),
    (COMPLETIONS, {"prompt": "hi", "logprobs": 30}, 400, "logprobs"),
    (COMPLETIONS, {"prompt": "hi", "stop_token_ids": [-1]}, 400, "stop_token_ids"),
    (COMPLETIONS, {"prompt": "hi", "n": 17, "stream": True}, 400, "n"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "hi", "model": "nope"}, 404, "model"),
    ("/tokenize", {"messages": [{"content": "hi"}]}, 400, "messages.0.role"),
    ("/detokenize", {}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
async def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    api: httpx.AsyncClient, engine: FakeEngineClient, path: str, body: Any, status: int, param: str | None
) -> None:
    if isinstance(body, bytes):
        response = await api.post(path, content=body, headers={"content-type": "application/json"})
    else:
        response = await api.post(path, json=body)
    error = assert_openai_error(response, status, param)
    assert error["type"] == "invalid_request_error"
    codes = {404: "model_not_found"}
    is_too_long = param == "max_tokens" and isinstance(body, dict) and body.get("max_tokens", 0) > 1000
    assert error["code"] == ("context_length_exceeded" if is_too_long else codes.get(status))
    assert engine.requests == []
    ok = await api.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200


async def test_best_of_1_is_accepted(api: httpx.AsyncClient) -> None:
    for path, body in ((CHAT, {"messages": MESSAGES}), (COMPLETIONS, {"prompt": "hi"})):
        assert (await api.post(path, json={**body, "best_of": 1, "max_tokens": 1})).status_code == 200


TOO_LONG_PROMPTS = [(CHAT, {"messages": [{"role": "user", "content": TOO_LONG}]}, "messages"),
                    (COMPLETIONS, {"prompt": TOO_LONG}, "prompt")]


@pytest.mark.parametrize(("path", "body", "param"), TOO_LONG_PROMPTS)
async def test_a_prompt_too_long_for_the_context_is_a_400(
    api: httpx.AsyncClient, engine: FakeEngineClient, path: str, body: dict[str, Any], param: str
) -> None:
    response = await api.post(path, json=body)
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert engine.requests == []


@pytest.mark.parametrize(("path", "body", "param"), TOO_LONG_PROMPTS)
async def test_a_prompt_too_long_for_the_context_names_the_prompt(
    api: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    error = assert_openai_error(await api.post(path, json=body), 400, param)
    assert error["code"] == "context_length_exceeded"
    assert f"in the {param}," in error["message"] and f"the length of the {param} or completion" in error["message"]
    is_chat = "messages" in body
    too_many: dict[str, Any] = (
        {"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 10**6} if is_chat
        else {"prompt": "Hi", "max_tokens": 10**6}
    )
    expected = "max_completion_tokens" if is_chat else "max_tokens"
    assert assert_openai_error(await api.post(path, json=too_many), 400, expected)["code"] == "context_length_exceeded"


async def test_oversized_body_is_413_before_parsing(api: httpx.AsyncClient) -> None:
    body = b'{"prompt": "' + b"x" * (8 * 2**20) + b'"}'
    response = await api.post(COMPLETIONS, content=body, headers={"content-type": "application/json"})
    assert assert_openai_error(response, 413)["code"] == "request_too_large"
    assert (await api.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 1})).status_code == 200


async def test_a_body_streamed_past_the_limit_is_413_too(api: httpx.AsyncClient) -> None:
    async def chunks() -> Any:
        yield b'{"prompt": "'
        for _ in range(9):
            yield b"x" * 2**20
        yield b'"}'

    response = await api.post(COMPLETIONS, content=chunks(), headers={"content-type": "application/json"})
    assert assert_openai_error(response, 413)["code"] == "request_too_large"


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, "/tokenize"])
async def test_a_wrong_method_is_an_openai_405(api: httpx.AsyncClient, path: str) -> None:
    assert_openai_error(await api.get(path), 405)


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain; charset=utf-8"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, "/tokenize"])
async def test_a_body_that_is_not_json_is_a_415_naming_its_content_type(
    api: httpx.AsyncClient, engine: FakeEngineClient, path: str, content_type: str
) -> None:
    body = b'{"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}'
    response = await api.post(path, content=body, headers={"content-type": content_type})
    error = assert_openai_error(response, 415)
    assert f"'{content_type.partition(';')[0]}'" in error["message"] and engine.requests == []
    for json_type in ("application/json; charset=utf-8", "application/vnd.api+json"):
        assert (await api.post(path, content=body, headers={"content-type": json_type})).status_code == 200
