"""Presence, frequency and repetition penalties, applied to a batch of logits at once."""

from __future__ import annotations

import torch


def token_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[num_seqs, max_len] ids padded with vocab_size → [num_seqs, vocab_size] counts."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.float32, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids, dtype=torch.float32))
    return counts[:, :vocab_size]


def apply_penalties(
    logits: torch.Tensor,
    output_token_ids: torch.Tensor,
    prompt_token_ids: torch.Tensor | None,
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    """OpenAI's presence/frequency penalties over the output tokens; the CTRL repetition penalty
    (divide positive logits, multiply negative ones) over prompt and output tokens."""
    vocab_size = logits.shape[-1]
    output_counts = token_counts(output_token_ids, vocab_size)
    if prompt_token_ids is not None:
        seen = (output_counts > 0) | (token_counts(prompt_token_ids, vocab_size) > 0)
        penalty = torch.where(seen, repetition_penalty.unsqueeze(1), 1.0)
        logits = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits = logits - frequency_penalty.unsqueeze(1) * output_counts
    return logits - presence_penalty.unsqueeze(1) * (output_counts > 0)
