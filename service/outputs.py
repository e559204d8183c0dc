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
            mine.text += theirs.text
            mine.token_ids.extend(theirs.token_ids)
            mine.finish_reason = theirs.finish_reason
            mine.stop_reason = theirs.stop_reason
            if mine.logprobs is None:
                mine.logprobs = theirs.logprobs
            elif theirs.logprobs is not None:
                mine.logprobs.extend(theirs.logprobs)
        self.finished = later.finished
        self.prompt_logprobs = self.prompt_logprobs or later.prompt_logprobs
