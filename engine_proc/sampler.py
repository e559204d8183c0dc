"""Picks each sequence's next token from its logits, vectorized over the batch."""

from __future__ import annotations

import torch

from proto.engine_input import SamplingParams


class Sampler:
    """Greedy, temperature, top-k and top-p sampling; seeded requests use their own generator."""

    def __call__(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        generators: list[torch.Generator | None],
    ) -> torch.Tensor:
        """logits [num_seqs, vocab] float32 → token ids [num_seqs]."""
        greedy_ids = logits.argmax(dim=-1)
        if all(p.is_greedy for p in params):
            return greedy_ids
        device = logits.device
        temperature = torch.tensor(
            [p.temperature if not p.is_greedy else 1.0 for p in params], device=device
        )
        logits = logits / temperature.unsqueeze(1)
        if any(p.top_k is not None for p in params):
            logits = _apply_top_k(logits, [p.top_k for p in params])
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], device=device)
            logits = _apply_top_p(logits, top_p)
        probs = logits.softmax(dim=-1)
        # NOTE: argmax(p / E) with E ~ Exp(1) draws from p (the exponential race), which lets
        # each seeded row draw its noise from its own generator.
        noise = torch.empty_like(probs).exponential_()
        for row, generator in enumerate(generators):
            if generator is not None:
                noise[row].exponential_(generator=generator)
        sampled_ids = (probs / noise).argmax(dim=-1)
        is_greedy = torch.tensor([p.is_greedy for p in params], device=device)
        return torch.where(is_greedy, greedy_ids, sampled_ids)


def _apply_top_k(logits: torch.Tensor, top_ks: list[int | None]) -> torch.Tensor:
    vocab_size = logits.shape[-1]
    k = torch.tensor([min(k or vocab_size, vocab_size) for k in top_ks], device=logits.device)
    kth_largest = logits.sort(dim=-1, descending=True).values.gather(1, (k - 1).unsqueeze(1))
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def _apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    # Drop a token when the tokens ranked above it already reach top_p.
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_ids, sorted_logits)
