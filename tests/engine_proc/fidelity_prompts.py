"""The chat questions the fidelity tests ask the real model, how they decode, and how we score against a reference."""

from __future__ import annotations

from typing import Any

from engine_proc.core import EngineCore
from proto.engine_input import EngineCoreRequest, SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers.",
]
MAX_NEW_TOKENS = 40
NGRAM_DRAFTS = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'


def run(core: EngineCore, prompts: list[list[int]], params: SamplingParams) -> dict[str, list[Any]]:
    """All prompts in one batch; each request's new token ids (and prompt logprobs where asked)."""
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    outputs: dict[str, list[Any]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work:
        for output in core.step().outputs:
            outputs[output.request_id] += output.new_token_ids
            if output.prompt_logprobs is not None:
                outputs[output.request_id].append(output.prompt_logprobs)
    return outputs


def teacher_forced_ranks(core: EngineCore, prompts: list[list[int]], references: list[list[int]]) -> list[int]:
    """Our rank of each reference token, fed the prompt and the reference's own tokens before it."""
    forced = run(
        core, [p + r for p, r in zip(prompts, references, strict=True)],
        SamplingParams(temperature=0.0, max_tokens=1, num_prompt_logprobs=0),
    )
    ranks = []
    for i, (prompt, reference) in enumerate(zip(prompts, references, strict=True)):
        logprobs = next(item for item in forced[str(i)] if not isinstance(item, int))
        # prompt_logprobs position j scores token j + 1 of the prompt.
        ranks += logprobs.ranks[len(prompt) - 1 : len(prompt) - 1 + len(reference)]
    return ranks
