"""A Responses API answer made from the chat answer that produced it: the whole Response object
from a chat.completion body, or the Responses event sequence from the chat's chunks (reasoning,
message and function-call items, each opened, filled by deltas and closed)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from service.openai.errors import APIError
from service.openai.responses_request import ResponsesRequest

# A finish reason's Response status, and the event a stream ends with in that status.
_STATUSES = {"length": "incomplete", "abort": "failed"}
_FINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}

CountTokens = Callable[[str], int]


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_base(
    body: ResponsesRequest, response_id: str, model: str, created_at: int, is_stored: bool
) -> dict[str, Any]:
    """The Response object before any output: what the request asked for, status in_progress."""
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": "in_progress",
        "model": model, "output": [], "error": None, "incomplete_details": None,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "parallel_tool_calls": body.parallel_tool_calls, "temperature": body.temperature, "top_p": body.top_p,
        "tool_choice": body.tool_choice, "tools": body.tools or [], "top_logprobs": body.top_logprobs,
        "text": body.text or {"format": {"type": "text"}}, "reasoning": body.reasoning,
        "metadata": body.metadata or {}, "user": body.user, "store": is_stored, "background": bool(body.background),
        "previous_response_id": body.previous_response_id, "truncation": "disabled", "usage": None,
    }


def finished(base: dict[str, Any], output: list[dict[str, Any]], finish_reason: str | None,
             usage: dict[str, Any] | None) -> dict[str, Any]:
    """The Response once its output is whole."""
    status = _STATUSES.get(finish_reason or "stop", "completed")
    details = {"reason": "max_output_tokens"} if status == "incomplete" else None
    error = {"code": "aborted", "message": "The request was aborted before it finished."} if status == "failed" else None
    return base | {"status": status, "output": output, "incomplete_details": details, "error": error, "usage": usage}


def responses_usage(chat_usage: dict[str, Any], num_reasoning_tokens: int) -> dict[str, Any]:
    """The chat's usage in the Responses' names."""
    details = chat_usage.get("prompt_tokens_details") or {}
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": details.get("cached_tokens", 0)},
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": num_reasoning_tokens},
        "total_tokens": chat_usage["total_tokens"],
    }


def whole_response(base: dict[str, Any], chat: dict[str, Any], count_tokens: CountTokens) -> dict[str, Any]:
    """The Response of a whole chat.completion body (one choice)."""
    (choice,) = chat["choices"]
    message, finish_reason = choice["message"], choice["finish_reason"]
    item_status = "incomplete" if finish_reason == "length" else "completed"
    output = []
    reasoning = message.get("reasoning") or ""
    if reasoning:
        output.append(_reasoning_item(reasoning, item_status))
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        logprobs = (choice.get("logprobs") or {}).get("content")
        output.append(_message_item(message.get("content") or "", logprobs, item_status))
    for call in calls:
        output.append(_function_call_item(call["id"], call["function"]["name"], call["function"]["arguments"],
                                          item_status))
    usage = responses_usage(chat["usage"], count_tokens(reasoning) if reasoning else 0)
    return finished(base, output, finish_reason, usage)


def items_page(items: list[dict[str, Any]], limit: int, order: str, after: str | None) -> dict[str, Any]:
    """A page of items in OpenAI's list shape: `limit` of them in `order` ("asc" or "desc") after the one `after` names."""
    ordered = items if order == "asc" else items[::-1]
    ids = [item["id"] for item in ordered]
    if after is not None and after not in ids:
        raise APIError(f"'after' names no item of this response: {after!r}.", param="after")
    start = 0 if after is None else ids.index(after) + 1
    page = ordered[start:start + limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)}


class ResponseEvents:
    """Turns a chat stream's chunks (one choice, usage last) into the Responses event sequence."""

    def __init__(self, base: dict[str, Any], count_tokens: CountTokens) -> None:
        self.base = base
        self.count_tokens = count_tokens
        self.output: list[dict[str, Any]] = []
        self.item: dict[str, Any] | None = None  # the open item
        self.text = ""  # the open item's text (or arguments)
        self.logprobs: list[dict[str, Any]] = []
        self.reasoning = ""
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.num_events = 0

    def opening(self) -> list[dict[str, Any]]:
        return [self._event("response.created", response=self.base), self._event("response.in_progress", response=self.base)]

    def feed(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat chunk."""
        if chunk.get("usage") is not None and not chunk["choices"]:
            self.usage = chunk["usage"]
        events: list[dict[str, Any]] = []
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning"):
                events += self._reasoning_delta(delta["reasoning"])
            if delta.get("content"):
                logprobs = (choice.get("logprobs") or {}).get("content") or []
                events += self._text_delta(delta["content"], logprobs)
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        return events

    def closing(self) -> list[dict[str, Any]]:
        """The open item's end, then the final Response (whole, with its usage)."""
        events = self._close()
        num_reasoning_tokens = self.count_tokens(self.reasoning) if self.reasoning else 0
        usage = None if self.usage is None else responses_usage(self.usage, num_reasoning_tokens)
        response = finished(self.base, self.output, self.finish_reason, usage)
        return [*events, self._event(_FINAL_EVENTS[response["status"]], response=response)]

    def _reasoning_delta(self, text: str) -> list[dict[str, Any]]:
        events = []
        if self.item is None or self.item["type"] != "reasoning":
            events += self._open(_reasoning_item("", "in_progress"), {"type": "reasoning_text", "text": ""})
        self.text += text
        self.reasoning += text
        return [*events, self._event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)]

    def _text_delta(self, text: str, logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        events = []
        if self.item is None or self.item["type"] != "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events += self._open(_message_item("", [], "in_progress"), part)
        self.text += text
        self.logprobs += logprobs
        return [*events, self._event("response.output_text.delta", **self._where(), content_index=0, delta=text,
                                     logprobs=logprobs)]

    def _call_delta(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events = []
        function = call.get("function") or {}
        if "id" in call:
            events += self._open(_function_call_item(call["id"], function.get("name", ""), "", "in_progress"))
        arguments = function.get("arguments") or ""
        if arguments and self.item is not None and self.item["type"] == "function_call":
            self.text += arguments
            events.append(self._event("response.function_call_arguments.delta", **self._where(), delta=arguments))
        return events

    def _open(self, item: dict[str, Any], part: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        events = self._close()
        self.item, self.text, self.logprobs = item, "", []
        events.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
        if part is not None:
            events.append(self._event("response.content_part.added", **self._where(), content_index=0, part=part))
        return events

    def _close(self) -> list[dict[str, Any]]:
        """The open item's closing events (its text whole, then the item whole)."""
        item = self.item
        if item is None:
            return []
        status = "incomplete" if self.finish_reason == "length" else "completed"
        where = self._where()
        if item["type"] == "function_call":
            whole = _function_call_item(item["call_id"], item["name"], self.text, status) | {"id": item["id"]}
            events = [self._event("response.function_call_arguments.done", **where, name=item["name"],
                                  arguments=self.text)]
        elif item["type"] == "reasoning":
            whole = _reasoning_item(self.text, status) | {"id": item["id"]}
            part = whole["content"][0]
            events = [self._event("response.reasoning_text.done", **where, content_index=0, text=self.text),
                      self._event("response.content_part.done", **where, content_index=0, part=part)]
        else:
            whole = _message_item(self.text, self.logprobs, status) | {"id": item["id"]}
            part = whole["content"][0]
            events = [self._event("response.output_text.done", **where, content_index=0, text=self.text,
                                  logprobs=self.logprobs),
                      self._event("response.content_part.done", **where, content_index=0, part=part)]
        events.append(self._event("response.output_item.done", output_index=len(self.output), item=whole))
        self.output.append(whole)
        self.item = None
        return events

    def _where(self) -> dict[str, Any]:
        assert self.item is not None
        return {"item_id": self.item["id"], "output_index": len(self.output)}

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.num_events, **fields}
        self.num_events += 1
        return event


def _reasoning_item(text: str, status: str) -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}] if text or status != "in_progress" else []
    return {"type": "reasoning", "id": new_item_id("rs"), "summary": [], "content": content, "status": status}


def _message_item(text: str, logprobs: list[dict[str, Any]] | None, status: str) -> dict[str, Any]:
    content = [] if status == "in_progress" else [
        {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    ]
    return {"type": "message", "id": new_item_id("msg"), "status": status, "role": "assistant", "content": content}


def _function_call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"type": "function_call", "id": new_item_id("fc"), "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}
