"""A Responses API answer made from the answer's typed steps: the Responses event sequence (reasoning,
message and function-call items, each opened, filled by deltas and closed) and the Response it ends
with, which is also the whole answer of a request that does not stream."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from service.openai.answer_events import AnswerEvents, Event
from service.openai.deltas import AnswerStep, CallPiece, Usage
from service.openai.errors import APIError
from service.openai.responses_request import ResponsesRequest

# A finish reason's Response status, and the event a stream ends with in that status.
_STATUSES = {"length": "incomplete", "abort": "failed"}
_FINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}

CountTokens = Callable[[str], int]
LogprobsOf = Callable[[AnswerStep], list[dict[str, Any]]]


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


def responses_usage(usage: Usage, num_reasoning_tokens: int) -> dict[str, Any]:
    """An answer's usage in the Responses' names."""
    return {
        "input_tokens": usage.num_prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.num_cached_tokens},
        "output_tokens": usage.num_completion_tokens,
        "output_tokens_details": {"reasoning_tokens": num_reasoning_tokens},
        "total_tokens": usage.num_prompt_tokens + usage.num_completion_tokens,
    }


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


class ResponseEvents(AnswerEvents):
    """The Responses event sequence of an answer's steps (one choice), and the Response it ends with."""

    def __init__(self, base: dict[str, Any], count_tokens: CountTokens, logprobs_of: LogprobsOf) -> None:
        super().__init__()
        self.base = base
        self.count_tokens = count_tokens
        self.logprobs_of = logprobs_of
        self.output: list[dict[str, Any]] = []
        self.item: dict[str, Any] | None = None  # the open item
        self.text = ""  # the open item's text (or arguments)
        self.logprobs: list[dict[str, Any]] = []
        self.reasoning_text = ""
        self.response = base
        self.num_events = 0

    def opening(self) -> list[Event]:
        return [self._event("response.created", response=self.base), self._event("response.in_progress", response=self.base)]

    def reasoning(self, text: str) -> list[Event]:
        events = []
        if self.item is None or self.item["type"] != "reasoning":
            events += self._open(_reasoning_item("", "in_progress"), {"type": "reasoning_text", "text": ""})
        self.text += text
        self.reasoning_text += text
        return [*events, self._event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)]

    def content(self, text: str, step: AnswerStep) -> list[Event]:
        events = []
        if self.item is None or self.item["type"] != "message":
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events += self._open(_message_item("", [], "in_progress"), part)
        logprobs = self.logprobs_of(step)
        self.text += text
        self.logprobs += logprobs
        return [*events, self._event("response.output_text.delta", **self._where(), content_index=0, delta=text,
                                     logprobs=logprobs)]

    def call(self, piece: CallPiece) -> list[Event]:
        events = []
        if piece.call_id is not None:
            events += self._open(_function_call_item(piece.call_id, piece.name or "", "", "in_progress"))
        if piece.arguments and self.item is not None and self.item["type"] == "function_call":
            self.text += piece.arguments
            events.append(self._event("response.function_call_arguments.delta", **self._where(), delta=piece.arguments))
        return events

    def closing(self) -> list[Event]:
        """The open item's end (an answer with no message and no call has an empty message), then the final
        Response (whole, with its usage)."""
        events = self._close()
        if not any(item["type"] in ("message", "function_call") for item in self.output):
            events += self._open(_message_item("", [], "in_progress"), {"type": "output_text", "text": "",
                                                                         "annotations": [], "logprobs": []})
            events += self._close()
        num_reasoning_tokens = self.count_tokens(self.reasoning_text) if self.reasoning_text else 0
        usage = None if self.usage is None else responses_usage(self.usage, num_reasoning_tokens)
        self.response = finished(self.base, self.output, self.finish_reason, usage)
        return [*events, self._event(_FINAL_EVENTS[self.response["status"]], response=self.response)]

    def whole(self) -> dict[str, Any]:
        return self.response

    def _open(self, item: dict[str, Any], part: dict[str, Any] | None = None) -> list[Event]:
        events = self._close()
        self.item, self.text, self.logprobs = item, "", []
        events.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
        if part is not None:
            events.append(self._event("response.content_part.added", **self._where(), content_index=0, part=part))
        return events

    def _close(self) -> list[Event]:
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
