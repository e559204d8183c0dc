"""Whole choices from a stream of (index, delta): what a non-streamed response returns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from proto.engine_output import Logprobs
from service.frontend.outputs import RequestOutput


@dataclass
class Choice:
    """One choice's whole output."""

    texts: list[str] = field(default_factory=list)
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: Logprobs | None = None
    prompt_logprobs: Logprobs | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts)

    def add(self, output: RequestOutput) -> None:
        completion = output.outputs[0]
        self.prompt_logprobs = self.prompt_logprobs or output.prompt_logprobs
        self.texts.append(completion.text)
        self.num_tokens += len(completion.token_ids)
        self.finish_reason = completion.finish_reason
        self.stop_reason = completion.stop_reason
        if completion.logprobs is not None:
            if self.logprobs is None:
                self.logprobs = Logprobs()
            self.logprobs.extend(completion.logprobs)


async def collect(outputs: AsyncIterator[tuple[int, RequestOutput]], num_choices: int) -> list[Choice]:
    """Drains the deltas of every choice; returns the choices in index order."""
    choices = [Choice() for _ in range(num_choices)]
    async for index, output in outputs:
        choices[index].add(output)
    return choices
