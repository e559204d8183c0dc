"""What the gateway hands to callers: one request's output (a delta while streaming)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np

from proto.engine_output import Logprobs


@dataclass
class CompletionOutput:
    """One generated sequence of a request; `text` and `token_ids` are this delta's."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: Logprobs | None = None

    def extend(self, later: CompletionOutput) -> None:
        """Appends a later delta of the same sequence."""
        self.text += later.text
        self.token_ids.extend(later.token_ids)
        self.finish_reason, self.stop_reason = later.finish_reason, later.stop_reason
        if self.logprobs is None:
            self.logprobs = later.logprobs
        elif later.logprobs is not None:
            self.logprobs.extend(later.logprobs)


@dataclass
class RequestOutput:
    """A request's new output since the caller last looked."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
    prompt_logprobs: Logprobs | None = None
    pooled: np.ndarray | None = None  # a pooling request's answer: its embedding, or a pair's scores

    @classmethod
    def empty_like(cls, delta: RequestOutput) -> RequestOutput:
        """An output with `delta`'s request and prompt and no samples yet, to add deltas to."""
        return cls(
            delta.request_id, delta.prompt, delta.prompt_token_ids, [],
            num_cached_tokens=delta.num_cached_tokens, prompt_logprobs=delta.prompt_logprobs,
        )

    def add(self, later: RequestOutput) -> None:
        """Appends a later delta: each of its samples to the sample of the same index."""
        for completion in later.outputs:
            while len(self.outputs) <= completion.index:
                self.outputs.append(CompletionOutput(len(self.outputs), "", []))
            self.outputs[completion.index].extend(completion)
        self.finished = later.finished
        self.num_cached_tokens = later.num_cached_tokens
        self.prompt_logprobs = self.prompt_logprobs or later.prompt_logprobs
        self.pooled = later.pooled if later.pooled is not None else self.pooled


def accumulate(running: dict[str, RequestOutput], delta: RequestOutput) -> RequestOutput:
    """Adds a delta to its request's output so far (outputs indexed by sample)."""
    output = running.get(delta.request_id)
    if output is None:
        output = running[delta.request_id] = RequestOutput.empty_like(delta)
    output.add(delta)
    return output


async def collect(
    outputs: AsyncIterator[tuple[int, RequestOutput]], num_prompts: int, n: int
) -> list[RequestOutput]:
    """Drains a request's (choice index, delta) stream: one whole output per prompt, its n samples
    in order (choice `i * n + j` is prompt i's sample j)."""
    whole: list[RequestOutput | None] = [None] * num_prompts
    async for index, delta in outputs:
        prompt_index, delta.outputs[0].index = divmod(index, n)
        output = whole[prompt_index] = whole[prompt_index] or RequestOutput.empty_like(delta)
        output.add(delta)
    return [output for output in whole if output is not None]
