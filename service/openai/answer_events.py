"""What Anthropic's Messages events and the Responses' events share: one choice's typed steps read
in one loop, each delta handed to the format's own event makers, the end and usage noted; the
whole answer (a Message, a Response) is what the events built, at their end."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from service.openai.deltas import AnswerStep, CallPiece, Content, Reasoning, Usage

Event = dict[str, Any]
Keep = Callable[[dict[str, Any]], Awaitable[None]]


class AnswerEvents(ABC):
    """A format's events of one choice's answer, and the whole answer they add up to."""

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.usage: Usage | None = None
        self.is_started = False  # NOTE: whether a step came: the prompt's cached tokens are known from it

    def feed(self, step: AnswerStep) -> list[Event]:
        """The events of one step."""
        self.usage = step.usage
        events = [] if self.is_started else self.started()
        self.is_started = True
        for delta in step.deltas:
            if isinstance(delta, Content):
                events += self.content(delta.text, step)
            elif isinstance(delta, Reasoning):
                events += self.reasoning(delta.text)
            else:
                for piece in delta.pieces:
                    events += self.call(piece)
        if step.finish_reason is not None:
            self.finish_reason, self.stop_reason = step.finish_reason, step.completion.stop_reason
        return events

    def opening(self) -> list[Event]:
        """The events sent before the engine's first output."""
        return []

    def started(self) -> list[Event]:
        """The events sent with the engine's first output."""
        return []

    @abstractmethod
    def reasoning(self, text: str) -> list[Event]: ...

    @abstractmethod
    def content(self, text: str, step: AnswerStep) -> list[Event]: ...

    @abstractmethod
    def call(self, piece: CallPiece) -> list[Event]: ...

    @abstractmethod
    def closing(self) -> list[Event]:
        """The last events; after them `whole` is the answer."""

    @abstractmethod
    def whole(self) -> dict[str, Any]:
        """The whole answer the events built."""

    async def stream(self, steps: AsyncIterator[AnswerStep], keep: Keep | None = None) -> AsyncIterator[Event]:
        """The events of `steps`; with `keep`, the whole answer is kept before the last event goes out, so
        a client may act on it as soon as it reads it."""
        for event in self.opening():
            yield event
        async for step in steps:
            for event in self.feed(step):
                yield event
        closing = self.closing()
        if keep is not None:
            await keep(self.whole())
        for event in closing:
            yield event

    async def answer(self, steps: AsyncIterator[AnswerStep]) -> dict[str, Any]:
        """The whole answer of `steps`, its events made and dropped."""
        async for _ in self.stream(steps):
            pass
        return self.whole()
