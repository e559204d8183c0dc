"""POST /v1/responses bodies, and the chat request each one is answered as: its instructions, the
conversation it continues (`previous_response_id`'s items) and its input items become messages, its
function tools, `tool_choice`, `text.format`, `reasoning` and `max_output_tokens` the chat's fields;
errors name the Responses field."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field

from service.openai.errors import APIError
from service.openai.protocol import ChatCompletionRequest, OpenAIModel, RequestId

# The `include` values this server honours ("reasoning.encrypted_content" asks for nothing it keeps).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_INCLUDES = {LOGPROBS_INCLUDE, "reasoning.encrypted_content"}
# vLLM's sampling extensions a Responses body may carry, passed to the chat request as they are.
_CHAT_EXTRAS = (
    "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "stop", "stop_token_ids",
    "ignore_eos", "min_tokens", "logit_bias", "priority", "structured_outputs", "skip_special_tokens",
    "chat_template_kwargs", "include_stop_str_in_output", "data_parallel_rank",
)
class ResponsesRequest(OpenAIModel):
    """POST /v1/responses: OpenAI's Responses API."""

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(min_length=1)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: str | None = None
    request_id: RequestId | None = None

    def check_supported(self, is_store_on: bool) -> None:
        """A 400 naming the first field that needs what this server does not have (`is_store_on`: it keeps responses)."""
        off = "this server keeps no responses (--responses-store off)"
        if self.store and not is_store_on:
            raise APIError(f"'store' is not supported: {off}; send 'store': false.", param="store")
        if self.previous_response_id is not None and not is_store_on:
            raise APIError(f"'previous_response_id' is not supported: {off}; send the whole conversation as "
                           "'input'.", param="previous_response_id")
        if self.conversation is not None:
            raise APIError("'conversation' is not supported: continue a conversation with 'previous_response_id'.",
                           param="conversation")
        if self.background and not self.is_stored(is_store_on):
            raise APIError("'background' needs a stored response: send 'store': true"
                           + ("." if is_store_on else f", which {off}."), param="background")
        if self.background and self.stream:
            raise APIError("'background' with 'stream' is not supported: poll GET /v1/responses/{id} instead.",
                           param="stream")
        if self.truncation not in (None, "disabled"):
            raise APIError("'truncation' must be 'disabled': a prompt longer than the context is refused.",
                           param="truncation")
        for index, include in enumerate(self.include or []):
            if include not in _INCLUDES:
                raise APIError(f"'include' value {include!r} is not supported; supported: {sorted(_INCLUDES)}.",
                               param=f"include.{index}")

    def is_stored(self, is_store_on: bool) -> bool:
        """Whether the response is kept: `store` is true unless sent false, as OpenAI's default."""
        return is_store_on and self.store is not False

    def input_items(self) -> list[dict[str, Any]]:
        """The input as items with ids, as GET /v1/responses/{id}/input_items lists them (text as parts)."""
        items = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        return [_with_id(item) for item in items]

    @property
    def is_logprobs_included(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])

    def to_chat_request(self, history: Sequence[dict[str, Any]] = ()) -> ResponsesChatRequest:
        """The chat request that answers this body after the items of `history` (the conversation
        `previous_response_id` continues); a 400 naming the Responses field it cannot take."""
        chat: dict[str, Any] = {
            "messages": self._messages(history),
            "stream": self.stream,
            "parallel_tool_calls": self.parallel_tool_calls,
            **{name: value for name, value in (self.model_extra or {}).items() if name in _CHAT_EXTRAS},
        }
        if self.stream:
            chat["stream_options"] = {"include_usage": True}
        for name, value in (("model", self.model), ("temperature", self.temperature), ("top_p", self.top_p),
                            ("max_completion_tokens", self.max_output_tokens), ("request_id", self.request_id)):
            if value is not None:
                chat[name] = value
        if self.is_logprobs_included:
            chat |= {"logprobs": True, "top_logprobs": self.top_logprobs or 0}
        if self.tools:
            chat["tools"] = [_chat_tool(tool, index) for index, tool in enumerate(self.tools)]
        if self.tool_choice != "auto" or self.tools:
            chat["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.text is not None and self.text.get("format") is not None:
            chat["response_format"] = _response_format(self.text["format"])
        effort = (self.reasoning or {}).get("effort")
        if effort is not None:
            chat["reasoning_effort"] = effort
        return ResponsesChatRequest.validated(chat)

    def _messages(self, history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = []
        # NOTE: as OpenAI's, a continued response's instructions are its own, not its previous one's.
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        for item in history:
            _add_item(messages, item, "previous_response_id")
        if isinstance(self.input, str):
            return [*messages, {"role": "user", "content": self.input}]
        for index, item in enumerate(self.input):
            _add_item(messages, item, f"input.{index}")
        if not any(message["role"] != "system" for message in messages):
            raise APIError("'input' has no message to answer.", param="input")
        return messages


class ResponsesChatRequest(ChatCompletionRequest):
    """The chat request a Responses body is answered as: its errors name the Responses fields."""

    PARAM_NAMES: ClassVar[dict[str, str]] = {
        "num_logprobs": "top_logprobs", "max_tokens": "max_output_tokens", "max_completion_tokens": "max_output_tokens",
        "messages": "input", "response_format": "text.format", "reasoning_effort": "reasoning.effort",
        "logprobs": "include",
    }
    WHOLE_PARAM_NAMES: ClassVar[frozenset[str]] = frozenset({"messages", "logprobs"})
    PROMPT_PARAM: ClassVar[str] = "input"


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], param: str) -> None:
    """Appends one input item as chat messages (consecutive function calls share one assistant turn)."""
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "system", "developer", "assistant"):
            raise APIError(f"'{param}.role' must be 'user', 'system', 'developer' or 'assistant', got {role!r}.",
                           param=f"{param}.role")
        messages.append({"role": role, "content": _text_of(item.get("content"), f"{param}.content")})
    elif kind == "function_call":
        call = {"id": _string(item, "call_id", param), "type": "function",
                "function": {"name": _string(item, "name", param), "arguments": _string(item, "arguments", param)}}
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else _text_of(output, f"{param}.output")
        messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", param), "content": content})
    elif kind != "reasoning":  # NOTE: earlier reasoning is not shown to the model again, as chat templates drop it
        raise APIError(f"Input items of type {kind!r} are not supported by this server.", param=f"{param}.type")


# The prefix of the id an input item of each type gets when it comes without one.
_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def _with_id(item: dict[str, Any]) -> dict[str, Any]:
    """An input item with an id (kept if it has one), a message's text content as parts."""
    kind = item.get("type", "message")
    kept = {"type": kind, **item}
    if "id" not in item:
        kept["id"] = f"{_ID_PREFIXES.get(kind, 'item')}_{uuid.uuid4().hex}"
    if kind == "message":
        kept.setdefault("status", "completed")
        if isinstance(item.get("content"), str):
            part_type = "output_text" if item.get("role") == "assistant" else "input_text"
            kept["content"] = [{"type": part_type, "text": item["content"]}]
    return kept


def _text_of(content: Any, param: str) -> str:
    """A message's content as text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"'{param}' must be a string or a list of text parts.", param=param)
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(f"Content parts of type {kind!r} are not supported: this server serves text models.",
                           param=f"{param}.{index}")
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _string(item: dict[str, Any], name: str, param: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise APIError(f"'{param}.{name}' must be a string.", param=f"{param}.{name}")
    return value


def _chat_tool(tool: dict[str, Any], index: int) -> dict[str, Any]:
    """A Responses function tool ({"type": "function", "name", "parameters", ...}) as the chat's."""
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise APIError(f"Only function tools ({{\"type\": \"function\", \"name\": ...}}) are supported, got "
                       f"{tool.get('type')!r}.", param=f"tools.{index}")
    function = {key: tool[key] for key in ("name", "description", "parameters", "strict") if tool.get(key) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise APIError(f"'tool_choice' must be 'auto', 'none', 'required' or a function, got {choice!r}.",
                   param="tool_choice")


def _response_format(text_format: dict[str, Any]) -> dict[str, Any]:
    """`text.format` as the chat's `response_format` (json_schema's fields move under `json_schema`)."""
    if text_format.get("type") != "json_schema":
        return text_format
    if not isinstance(text_format.get("schema"), dict):
        raise APIError("'text.format' of type 'json_schema' needs a 'schema' object.", param="text.format.schema")
    fields = ("name", "schema", "strict", "description")
    return {"type": "json_schema", "json_schema": {key: text_format[key] for key in fields if key in text_format}}
