"""An answer as every format renders it: what each engine output adds to one choice (reasoning,
content, tool-call pieces), how the choice ended and the usage so far. The engine's outputs become
these once (`answer_steps` in response_bodies.py); chat chunks, Anthropic's events and the Responses'
events each render them."""

from __future__ import annotations

from dataclasses import dataclass

from service.frontend.outputs import CompletionOutput, RequestOutput


@dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclass(frozen=True, slots=True)
class Content:
    text: str


@dataclass(frozen=True, slots=True)
class CallPiece:
    """A piece of the choice's call `index`: its start (with `call_id` and `name`), or more of its arguments."""

    index: int
    arguments: str
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCalls:
    """Pieces of one or more calls that came together."""

    pieces: tuple[CallPiece, ...]


Delta = Reasoning | Content | ToolCalls


@dataclass(frozen=True, slots=True)
class Usage:
    num_prompt_tokens: int
    num_completion_tokens: int
    num_cached_tokens: int


@dataclass(frozen=True, slots=True)
class AnswerStep:
    """What one engine output adds to choice `index`: its deltas, its end once it ended (the finish
    reason as the answer's reader says it: "tool_calls" once a call was made), the usage so far, and
    the output itself (its logprobs and token ids)."""

    index: int
    deltas: list[Delta]
    finish_reason: str | None
    usage: Usage
    output: RequestOutput

    @property
    def completion(self) -> CompletionOutput:
        return self.output.outputs[0]


def reasoning_fields(reasoning: str) -> dict[str, str]:
    # NOTE: vLLM's name for it now, and the one clients of its earlier versions read.
    return {"reasoning": reasoning, "reasoning_content": reasoning}
