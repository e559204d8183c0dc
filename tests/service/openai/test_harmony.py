"""gpt-oss's harmony format: an answer read whole and streamed (cut at every position, a character at
a time, special tokens split) gives the same reasoning, content and calls; output that is not
harmony, or is cut short, is read without an error; messages render through gpt-oss's template as
transformers renders them (with the values llama.cpp gives it)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as Backend
from tokenizers import models

from service.config import GatewayConfig
from service.model_files.tokenizer import Tokenizer
from service.openai.answer import HarmonyAnswer, choice_answer, resolve_parsers
from service.openai.harmony import HarmonyStream, Piece, is_harmony_template, template_messages
from service.openai.protocol import ChatCompletionRequest
from service.openai.response_bodies import chat_delta

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]},
}}
CALL = '{"location":"Paris"}'

CASES = [
    # answer, reasoning (None: none), content, calls as (name, arguments)
    ("<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>The answer<|return|>",
     "Think.", "The answer", []),
    ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
     f"to=functions.get_weather <|constrain|>json<|message|>{CALL}<|call|>", "Need the weather.", "", [("get_weather", CALL)]),
    # NOTE: the recipient in the role's header, as the template writes earlier calls
    (f" to=functions.get_weather<|channel|>commentary json<|message|>{CALL}<|call|>", None, "", [("get_weather", CALL)]),
    ("<|channel|>final<|message|>No reasoning, a < b <| not a token<|return|>", None, "No reasoning, a < b <| not a token", []),
    ("<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather"
     f"<|message|>{CALL}<|call|>", None, "Let me look.", [("get_weather", CALL)]),
    # NOTE: gpt-oss-20b's stray commentary before a channel (llama.cpp reads past it too)
    ("<|channel|>commentary to=assistant<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Yes.", "Hm.", "Yes.", []),
    # NOTE: a built-in tool's call and a message the model wrote as the tool are not the answer's
    ("<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>commentary to=browser.search<|message|>"
     '{"query":"x"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{}<|end|>'
     "<|start|>assistant<|channel|>final<|message|>Done.", "Search.", "Done.", []),
    # NOTE: a new header without its message's end
    ("<|channel|>analysis<|message|>A<|start|>assistant<|channel|>final<|message|>B", "A", "B", []),
    ("<|channel|>analysis<|message|>A<|channel|>final<|message|>B", "A", "B", []),
    # NOTE: not harmony at all, cut short, or a header that never ends
    ("Plain text, no format.", None, "Plain text, no format.", []),
    ("<|channel|>analysis<|message|>cut short by max_tokens", "cut short by max_tokens", "", []),
    ("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>fin", "x", "", []),
    (f" to=functions.get_weather<|channel|>commentary json<|message|>{CALL[:9]}", None, "", [("get_weather", CALL[:9])]),
    ("<|channel|>" + "a" * 300, None, "<|channel|>" + "a" * 300, []),
    ("", None, "", []),
]


def read(pieces: list[Piece], has_reasoned: bool) -> tuple[str | None, str, list[tuple[str, str]]]:
    """(reasoning, content, calls) of a stream's pieces."""
    calls: list[list[str]] = []
    for kind, text in pieces:
        if kind == "call":
            calls.append([text, ""])
        elif kind == "arguments":
            calls[-1][1] += text
    reasoning = "".join(text for kind, text in pieces if kind == "reasoning")
    content = "".join(text for kind, text in pieces if kind == "content")
    return (reasoning if has_reasoned else None), content, [(name, arguments) for name, arguments in calls]


def streamed(pieces: list[str]) -> tuple[str | None, str, list[tuple[str, str]]]:
    stream = HarmonyStream()
    out = [piece for text in pieces for piece in stream.feed(text)] + stream.finish()
    return read(out, stream.has_reasoned)


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), CASES)
def test_whole_and_streamed_at_every_cut_agree(text: str, reasoning: str | None, content: str, calls: list[Any]) -> None:
    assert streamed([text]) == (reasoning, content, calls)
    assert streamed(list(text)) == (reasoning, content, calls)
    for cut in range(len(text) + 1):
        for third in range(cut, len(text) + 1, 7):
            assert streamed([text[:cut], text[cut:third], text[third:]]) == (reasoning, content, calls), (cut, third)


def test_special_tokens_split_across_deltas_never_leak() -> None:
    stream = HarmonyStream()
    assert stream.feed("<|chan") == []
    assert stream.feed("nel|>analysis<|mess") == []
    assert stream.feed("age|>step one<|e") == [Piece("reasoning", "step one")]
    assert stream.feed("nd|><|start|>assistant<|channel|>commentary to=functions.get") == []
    assert stream.feed("_weather <|constrain|>json<|message|>{") == [Piece("call", "get_weather"), Piece("arguments", "{")]
    assert stream.feed('"location":"Paris"}<|ca') == [Piece("arguments", '"location":"Paris"}')]
    assert stream.feed("ll|>") == []
    assert stream.finish() == []


def body(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=[{"role": "user", "content": "Weather in Paris?"}], **fields)


def test_an_answer_is_its_deltas_joined_and_a_call_ends_it_with_tool_calls() -> None:
    text = CASES[1][0]
    message, finish_reason = HarmonyAnswer(body(tools=[WEATHER])).whole(text, "stop")
    (call,) = message.pop("tool_calls")
    assert call["id"].startswith("call_") and call["function"] == {"name": "get_weather", "arguments": CALL}
    assert message == {"content": None, "reasoning": "Need the weather.", "reasoning_content": "Need the weather."}
    assert finish_reason == "tool_calls"
    answer = HarmonyAnswer(body(tools=[WEATHER]))
    deltas = [delta for i in range(0, len(text), 5) for delta in answer.delta(text[i:i + 5])]
    last, finish_reason = answer.finish("stop")
    deltas = [chat_delta(d) for d in deltas + last]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather."
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"].startswith("call_")
    assert all(c["index"] == 0 for c in calls) and "id" not in calls[1]
    assert "".join(c["function"]["arguments"] for c in calls) == CALL and finish_reason == "tool_calls"


def test_a_call_without_tools_offered_is_dropped_and_reasoning_can_be_left_out() -> None:
    message, finish_reason = HarmonyAnswer(body()).whole(CASES[1][0], "stop")
    assert (message["content"], "tool_calls" in message, finish_reason) == ("", False, "stop")
    hidden, _ = HarmonyAnswer(body(include_reasoning=False)).whole(CASES[0][0], "stop")
    assert hidden == {"content": "The answer"}
    cut, finish_reason = HarmonyAnswer(body(tools=[WEATHER])).whole(CASES[12][0], "length")
    assert cut["tool_calls"][0]["function"]["arguments"] == CALL[:9] and finish_reason == "length"


def test_auto_parsers_are_harmony_for_a_harmony_template_and_it_is_one_format() -> None:
    harmony_template = "{{ '<|start|>assistant<|channel|>final<|message|>' }}"
    assert is_harmony_template(harmony_template) and not is_harmony_template("<|im_start|>") and not is_harmony_template(None)
    assert resolve_parsers("auto", "auto", harmony_template) == ("harmony", "harmony")
    assert resolve_parsers("auto", "auto", "<|im_start|>") == (None, None)
    assert resolve_parsers("hermes", "qwen3", harmony_template) == ("hermes", "qwen3")
    assert resolve_parsers("none", "harmony", None) == ("harmony", "harmony")
    assert isinstance(choice_answer(body(), "harmony", "harmony"), HarmonyAnswer)
    with pytest.raises(ValueError, match="harmony is one format"):
        GatewayConfig(model="m", tool_call_parser="hermes", reasoning_parser="harmony")


TOOL_ROUND_TRIP = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "reasoning_content": "I should call the tool.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 20}'},
]


def test_a_tool_round_trip_renders_as_the_template_does_with_llama_cpps_values(llama_cpp_tree: Path) -> None:
    """Reasoning becomes `thinking` and the arguments a JSON value; the template then renders as
    transformers renders it given those values."""
    from transformers.utils.chat_template_utils import render_jinja_template

    template = (llama_cpp_tree / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    assert is_harmony_template(template)
    messages = [{**m, "content": m["content"] or ""} for m in TOOL_ROUND_TRIP]  # NOTE: as ChatMessage gives them
    ours = Tokenizer(Backend(models.BPE()), template, {}).apply_chat_template(
        template_messages(messages), add_generation_prompt=True, tools=[WEATHER]
    )
    given = copy.deepcopy(TOOL_ROUND_TRIP)
    del given[2]["content"]
    given[2]["tool_calls"][0]["function"]["arguments"] = {"location": "Paris"}
    (theirs,), _ = render_jinja_template([given], tools=[WEATHER], chat_template=template, add_generation_prompt=True)
    assert ours == theirs
    assert ours.endswith(
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>analysis<|message|>I should call the tool.<|end|>"
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"location": "Paris"}<|call|>'
        f"<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{json.dumps(given[3]['content'])}"
        "<|end|><|start|>assistant"
    )
