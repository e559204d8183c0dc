"""Presence, frequency and repetition penalties, applied to a batch of logits at once.

Each penalized request keeps a [vocab] count of its output tokens that grows by the step's new
token, so a step costs O(batch) and not O(tokens generated so far).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine_proc.request import Request


class TokenCounts:
    """Per penalized request: output token counts and, for repetition penalties, a prompt mask."""

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size = vocab_size
        self.device = device
        self._counts: dict[str, torch.Tensor] = {}
        self._num_counted: dict[str, int] = {}
        self._prompt_masks: dict[str, torch.Tensor] = {}

    def output_counts(self, requests: Sequence[Request]) -> torch.Tensor:
        """[num_seqs, vocab] counts of each request's output tokens (zeros for unpenalized rows)."""
        zeros = torch.zeros(self.vocab_size, device=self.device)
        return torch.stack([self._sync(r) if r.sampling_params.has_penalties else zeros for r in requests])

    def prompt_mask(self, requests: Sequence[Request]) -> torch.Tensor:
        """[num_seqs, vocab] True where a token is in the request's prompt (repetition penalty only)."""
        empty = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        rows = []
        for request in requests:
            if request.sampling_params.repetition_penalty == 1.0:
                rows.append(empty)
                continue
            mask = self._prompt_masks.get(request.request_id)
            if mask is None:
                mask = empty.clone()
                mask[torch.tensor(request.prompt_token_ids, device=self.device)] = True
                self._prompt_masks[request.request_id] = mask
            rows.append(mask)
        return torch.stack(rows)

    def free(self, request_id: str) -> None:
        self._counts.pop(request_id, None)
        self._num_counted.pop(request_id, None)
        self._prompt_masks.pop(request_id, None)

    def _sync(self, request: Request) -> torch.Tensor:
        counts = self._counts.get(request.request_id)
        if counts is None:
            counts = torch.zeros(self.vocab_size, device=self.device)
            self._counts[request.request_id] = counts
        num_counted = self._num_counted.get(request.request_id, 0)
        new_ids = request.output_token_ids[num_counted:]
        if new_ids:
            ids = torch.tensor(new_ids, device=self.device)
            counts.index_add_(0, ids, torch.ones(len(new_ids), device=self.device))
            self._num_counted[request.request_id] = request.num_output_tokens
        return counts


def apply_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    prompt_mask: torch.Tensor | None,
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    """OpenAI's presence/frequency penalties over the output tokens; the CTRL repetition penalty
    (divide positive logits, multiply negative ones) over prompt and output tokens."""
    if prompt_mask is not None:
        seen = (output_counts > 0) | prompt_mask
        penalty = torch.where(seen, repetition_penalty.unsqueeze(1), 1.0)
        logits = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits = logits - frequency_penalty.unsqueeze(1) * output_counts
    return logits - presence_penalty.unsqueeze(1) * (output_counts > 0)
