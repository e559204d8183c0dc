"""The sampler on fixed logits (no model)."""

from __future__ import annotations

import torch

from engine_proc.sampler import Sampler
from proto.engine_input import SamplingParams

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))


def draw(params: SamplingParams, num_draws: int = 4000) -> torch.Tensor:
    sampler = Sampler()
    logits = LOGITS.repeat(num_draws, 1)
    ids = sampler(logits, [params] * num_draws, [None] * num_draws)
    return torch.bincount(ids, minlength=4).float() / num_draws


def test_greedy_picks_the_argmax() -> None:
    assert Sampler()(LOGITS, [SamplingParams(temperature=0.0)], [None]).tolist() == [0]


def test_temperature_one_follows_the_distribution() -> None:
    freqs = draw(SamplingParams(temperature=1.0))
    assert torch.allclose(freqs, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)


def test_top_k_and_top_p_never_leave_the_allowed_set() -> None:
    assert draw(SamplingParams(top_k=2))[2:].sum() == 0
    freqs = draw(SamplingParams(top_p=0.7))  # 0.5 + 0.3 reaches 0.7: two tokens stay
    assert freqs[2:].sum() == 0
    assert torch.allclose(freqs[:2], torch.tensor([0.625, 0.375]), atol=0.03)


def test_seeded_generator_reproduces_draws() -> None:
    sampler = Sampler()
    params = SamplingParams(temperature=1.0, seed=3)
    first = [sampler(LOGITS, [params], [g]).item() for g in [torch.Generator().manual_seed(3)] * 20]
    gen = torch.Generator().manual_seed(3)
    second = [sampler(LOGITS, [params], [gen]).item() for _ in range(20)]
    assert first == second
