"""The chat request a Messages body is answered as: `system` and the turns become chat messages
(tool_use blocks the assistant's tool calls, tool_result blocks tool messages), tools with
`input_schema` function tools, `tool_choice` the chat's, `thinking` the template's
`enable_thinking`; errors raised on the chat's fields name the Messages fields."""

from __future__ import annotations

import json
from typing import Any, ClassVar

from service.anthropic.protocol import (
    CountTokensRequest,
    Message,
    MessagesRequest,
    TextBlock,
    ToolChoice,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlock,
    ToolUseBlock,
)
from service.openai.protocol import ChatCompletionRequest

# NOTE: Anthropic's top effort has no chat name; the chat's highest stands for it.
_EFFORTS = {"max": "xhigh"}


class MessagesChatRequest(ChatCompletionRequest):
    """The chat request a Messages body is answered as: its errors name the Messages fields."""

    PARAM_NAMES: ClassVar[dict[str, str]] = {
        "num_logprobs": "top_logprobs", "num_prompt_logprobs": "prompt_logprobs", "stop": "stop_sequences",
        "response_format": "output_config.format", "reasoning_effort": "output_config.effort",
        "max_completion_tokens": "max_tokens",
    }
    WHOLE_PARAM_NAMES: ClassVar[frozenset[str]] = frozenset(PARAM_NAMES)
    PROMPT_PARAM: ClassVar[str] = "messages"


def to_chat_request(body: CountTokensRequest) -> MessagesChatRequest:
    """The chat request that answers `body` (a count_tokens body: one that generates a single token)."""
    messages = _chat_messages(body)
    chat: dict[str, Any] = {"model": body.model, "messages": messages, "max_tokens": 1}
    last = messages[-1]
    if last["role"] == "assistant" and last["content"] and "tool_calls" not in last:
        # NOTE: a last assistant turn is Anthropic's prefill: the answer goes on from its text.
        chat |= {"add_generation_prompt": False, "continue_final_message": True}
    if body.tools:
        chat["tools"] = [_chat_tool(tool.name, tool.description, tool.input_schema) for tool in body.tools]
    if body.tool_choice is not None:
        chat["tool_choice"] = _chat_tool_choice(body.tool_choice)
        chat["parallel_tool_calls"] = not getattr(body.tool_choice, "disable_parallel_tool_use", False)
    if body.thinking is not None:
        is_thinking = body.thinking.type != "disabled"
        chat |= {"chat_template_kwargs": {"enable_thinking": is_thinking}, "include_reasoning": is_thinking}
    output = body.output_config
    if output is not None and output.format is not None:
        schema = {"name": "output", "schema": output.format.schema_}
        chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    if output is not None and output.effort is not None:
        chat["reasoning_effort"] = _EFFORTS.get(output.effort, output.effort)
    if isinstance(body, MessagesRequest):
        chat |= _sampling_fields(body)
    return MessagesChatRequest.validated(chat)


def _sampling_fields(body: MessagesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {"max_tokens": body.max_tokens, "stream": body.stream}
    if body.stream:
        fields["stream_options"] = {"include_usage": True}
    if body.stop_sequences:
        fields["stop"] = body.stop_sequences
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(body, name)
        if value is not None:
            fields[name] = value
    return fields


def _chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.system:
        messages.append({"role": "system", "content": _joined(body.system)})
    for message in body.messages:
        messages += _turn(message)
    return messages


def _turn(message: Message) -> list[dict[str, Any]]:
    """One Messages turn as chat messages: a user turn's tool results as tool messages, then its
    text; an assistant turn's text with its tool calls; a system turn's text. Thinking blocks are dropped."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts = [block for block in message.content if isinstance(block, TextBlock)]
    if message.role == "system":
        # NOTE: kept where it stands, so the prompt before it stays a prefix the cache holds.
        return [{"role": "system", "content": _joined(texts)}]
    if message.role == "user":
        results = [block for block in message.content if isinstance(block, ToolResultBlock)]
        turn = [{"role": "tool", "tool_call_id": result.tool_use_id, "content": result.text} for result in results]
        return turn + ([{"role": "user", "content": _joined(texts)}] if texts or not results else [])
    calls = [_chat_call(block) for block in message.content if isinstance(block, ToolUseBlock)]
    assistant: dict[str, Any] = {"role": "assistant", "content": _joined(texts)}
    return [assistant | {"tool_calls": calls} if calls else assistant]


def _joined(text: str | list[TextBlock]) -> str:
    return text if isinstance(text, str) else "\n\n".join(block.text for block in text)


def _chat_call(block: ToolUseBlock) -> dict[str, Any]:
    arguments = json.dumps(block.input, ensure_ascii=False)
    return {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}


def _chat_tool(name: str, description: str | None, input_schema: dict[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": input_schema}
    if description is not None:
        function["description"] = description
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    if isinstance(choice, ToolChoiceAuto):
        return "auto"
    if isinstance(choice, ToolChoiceAny):
        return "required"
    if isinstance(choice, ToolChoiceNone):
        return "none"
    assert isinstance(choice, ToolChoiceTool)
    return {"type": "function", "function": {"name": choice.name}}
