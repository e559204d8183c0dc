"""Structured outputs on the routes, in process on a fake engine: a grammar the engine could not
compile (in time) is a 400 on every route, a reasoning parser's tags reach the engine with the
constraint, and with llguidance the gateway checks constraints with its parser."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from service.model_files.tokenizer import Tokenizer
from tests.service.api.fake_engine import FakeEngineClient

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Name a colour."}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


async def post(api: httpx.AsyncClient, path: str, **body: Any) -> dict[str, Any]:
    response = await api.post(path, json={"messages": MESSAGES, "max_tokens": 8, "ignore_eos": True, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.parametrize(("path", "body", "param"), [
    (CHAT, {"messages": MESSAGES, "response_format": {"type": "json_object"}}, "response_format"),
    (CHAT, {"messages": MESSAGES, "structured_outputs": {"regex": "[a-z]+"}, "stream": True}, "structured_outputs"),
    (CHAT, {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required", "stream": True}, "tool_choice"),
    ("/v1/completions", {"prompt": "Hi", "structured_outputs": {"choice": ["a", "b"]}, "n": 2}, "structured_outputs"),
    ("/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_object"}}, "stream": True}, "text.format"),
])
async def test_a_grammar_the_engine_could_not_compile_in_time_is_a_400_before_any_answer(
    api: httpx.AsyncClient, engine: FakeEngineClient, path: str, body: dict[str, Any], param: str
) -> None:
    engine.grammar_error = "the structured output's grammar did not compile within 10 s"
    response = await api.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "did not compile within 10 s" in error["message"], error
    assert engine.running_ids == []
    engine.grammar_error = None
    assert (await api.post(path, json=body)).status_code == 200


@pytest.mark.parametrize(("parser", "answer_so_far", "is_reasoning"), [
    ("qwen3", None, False),  # the answer may open <think> itself
    ("qwen3", "<think>", True),  # the prompt opened it: the answer reasons first
    ("qwen3", "<think>\n\n</think>\n\n", None),  # thinking turned off: constrained from the first token
    ("deepseek_r1", None, True),  # reasons from its first token
    (None, None, None),  # no reasoning parser: constrained from the first token
])
async def test_with_a_reasoning_parser_a_constraint_holds_after_the_reasoning(
    serve: Any, engine: FakeEngineClient, tokenizer: Tokenizer, parser: str | None, answer_so_far: str | None,
    is_reasoning: bool | None,
) -> None:
    body: dict[str, Any] = {"response_format": {"type": "json_object"}}
    if answer_so_far is not None:
        body |= {"messages": [*MESSAGES, {"role": "assistant", "content": answer_so_far}],
                 "add_generation_prompt": False, "continue_final_message": True}
    async with serve(reasoning_parser=parser or "none") as api:
        await post(api, CHAT, **body)
    spec = engine.requests[-1].sampling_params.structured_output
    assert spec is not None and spec.kind == "json_object"
    if is_reasoning is None:
        assert spec.reasoning_end_ids == [] and not spec.is_reasoning
    else:
        assert spec.reasoning_start_ids == tokenizer.encode("<think>")
        assert spec.reasoning_end_ids == tokenizer.encode("</think>") and spec.is_reasoning is is_reasoning


async def test_with_llguidance_constraints_are_checked_by_its_parser(
    serve: Any, engine: FakeEngineClient
) -> None:
    lark = {"structured_outputs": {"grammar": 'start: "yes" | "no"'}}  # NOTE: Lark, which xgrammar does not read
    async with serve() as api:
        refused = await api.post(CHAT, json={"messages": MESSAGES, **lark})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "structured_outputs.grammar"
    engine.ready.structured_output_backend = "guidance"
    async with serve() as api:
        await post(api, CHAT, **lark)
        assert engine.requests[-1].sampling_params.structured_output.spec == 'start: "yes" | "no"'  # type: ignore[union-attr]
        bad = await api.post(CHAT, json={"messages": MESSAGES, "structured_outputs": {"regex": "[a-"}})
        error = bad.json()["error"]
        assert bad.status_code == 400 and error["param"] == "structured_outputs.regex"
        assert "unclosed character class" in error["message"], error
        unique = {"response_format": {"type": "json_schema", "json_schema": {
            "name": "tags", "schema": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}}}}
        refused = await api.post(CHAT, json={"messages": MESSAGES, **unique})
        assert refused.status_code == 400 and "uniqueItems" in refused.json()["error"]["message"], refused.text
