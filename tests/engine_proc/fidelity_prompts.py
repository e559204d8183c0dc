"""The chat questions the fidelity tests ask the real model, how they decode, and how we score against a reference."""

from __future__ import annotations

from typing import Any

import torch

from engine_proc.core import EngineCore
from engine_proc.cpu.quantized_linear import Linear
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


def reference_margin(hf_reference_model: object, token_ids: list[int]) -> float:
    """How far the reference's most likely next token leads its second, in nats."""
    with torch.no_grad():
        logits = hf_reference_model(torch.tensor([token_ids])).logits  # type: ignore[operator]
    top2 = logits[0, -1].log_softmax(-1).topk(2).values
    return (top2[0] - top2[1]).item()


def planned_forms(core: EngineCore) -> set[str]:
    """Every form the load-time plan runs for some batch size, the output head's included."""
    model = core.model_runner.model
    matmuls = [module.forms for module in model.modules() if isinstance(module, Linear)] + [model.head]
    return {form for matmul in matmuls if matmul is not None for _, form in matmul.plan}
