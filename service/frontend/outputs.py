"""What the gateway hands to callers: one request's output (a delta while streaming)."""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def merge(self, later: RequestOutput) -> None:
        """Appends a later delta to this one (the consumer fell behind)."""
        for mine, theirs in zip(self.outputs, later.outputs, strict=True):
            mine.extend(theirs)
        self.finished = later.finished
        self.prompt_logprobs = self.prompt_logprobs or later.prompt_logprobs


def accumulate(running: dict[str, RequestOutput], delta: RequestOutput) -> RequestOutput:
    """Adds a sample's delta to its request's output so far (outputs indexed by sample)."""
    output = running.get(delta.request_id)
    if output is None:
        output = running[delta.request_id] = RequestOutput(
            delta.request_id, delta.prompt, delta.prompt_token_ids, [],
            num_cached_tokens=delta.num_cached_tokens, prompt_logprobs=delta.prompt_logprobs,
        )
    completion = delta.outputs[0]
    while len(output.outputs) <= completion.index:
        output.outputs.append(CompletionOutput(len(output.outputs), "", []))
    output.outputs[completion.index].extend(completion)
    output.prompt_logprobs = output.prompt_logprobs or delta.prompt_logprobs
    output.finished = delta.finished
    return output
