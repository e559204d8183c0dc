"""Prompt logprobs: how likely each prompt token was given the ones before it.

A prompt's prefill may span several steps (chunked prefill), so each step's rows are scored as
they are computed and held here until the step that samples the first output token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine_proc.scheduler import ScheduledRequest
from proto.engine_output import Logprobs


class PromptLogprobs:
    """Per request that asked: the prompt logprobs computed so far (from the second prompt token)."""

    def __init__(self) -> None:
        self._partial: dict[str, Logprobs] = {}

    def update(
        self,
        order: Sequence[ScheduledRequest],
        hidden: torch.Tensor,
        compute_logits: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        """Scores this step's prompt positions; `order` is the flat layout of `hidden`'s rows."""
        row_start = 0
        for request, num_new, _ in order:
            num_top = request.sampling_params.num_prompt_logprobs
            start = request.num_computed_tokens
            if num_top is not None and request.num_output_tokens == 0:
                if start == 0:
                    self._partial[request.request_id] = Logprobs()  # NOTE: recomputed after a preemption.
                end = min(start + num_new, request.num_prompt_tokens - 1)
                if end > start:
                    rows = hidden[row_start : row_start + end - start]
                    targets = request.prompt_token_ids[start + 1 : end + 1]
                    self._partial[request.request_id].extend(_score(compute_logits(rows), targets, num_top))
            row_start += num_new

    def pop(self, request_id: str) -> Logprobs | None:
        return self._partial.pop(request_id, None)


def _score(logits: torch.Tensor, target_ids: list[int], num_top: int) -> Logprobs:
    logprobs = logits.float().log_softmax(dim=-1)
    targets = torch.tensor(target_ids, device=logits.device).unsqueeze(1)
    chosen = logprobs.gather(1, targets)
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    top_values, top_ids = logprobs.topk(num_top, dim=-1)
    return Logprobs(
        torch.cat([targets, top_ids], dim=1).tolist(),
        torch.cat([chosen, top_values], dim=1).tolist(),
        ranks.tolist(),
    )
