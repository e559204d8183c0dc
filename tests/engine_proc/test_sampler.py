"""The sampler on fixed logits (no model): allowed sets, frequencies, penalties, logprobs."""

from __future__ import annotations

import pytest
import torch

from engine_proc.sampler import Sampler, SamplerOutput
from engine_proc.sampling_metadata import SamplingMetadata
from proto.engine_input import SamplingParams

PROBS = torch.tensor([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
LOGITS = torch.log(PROBS).unsqueeze(0)
VOCAB = PROBS.numel()


def sample(
    logits: torch.Tensor,
    params: list[SamplingParams],
    output_token_ids: list[list[int]] | None = None,
    banned: list[list[int]] | None = None,
    generators: dict[int, torch.Generator] | None = None,
) -> SamplerOutput:
    num_seqs, vocab_size = logits.shape
    outputs = output_token_ids or [[]] * num_seqs
    metadata = SamplingMetadata.build(
        params,
        banned or [[]] * num_seqs,
        generators or {},
        vocab_size,
        torch.device("cpu"),
        output_counts=lambda: torch.stack(
            [torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size).float() for ids in outputs]
        ),
        prompt_mask=lambda: torch.zeros(num_seqs, vocab_size, dtype=torch.bool),
    )
    return Sampler()(logits, metadata)


def frequencies(params: SamplingParams, num_draws: int = 20_000) -> torch.Tensor:
    ids = sample(LOGITS.repeat(num_draws, 1), [params] * num_draws).token_ids
    return torch.bincount(ids, minlength=VOCAB).float() / num_draws


def renormalized(keep: list[int]) -> torch.Tensor:
    expected = torch.zeros(VOCAB)
    expected[keep] = PROBS[keep] / PROBS[keep].sum()
    return expected


def test_greedy_picks_the_argmax() -> None:
    assert sample(LOGITS, [SamplingParams(temperature=0.0)]).token_ids.tolist() == [0]
    assert sample(LOGITS * 1e6, [SamplingParams(temperature=1e-30)]).token_ids.tolist() == [0]


def test_temperature_one_follows_the_distribution() -> None:
    assert torch.allclose(frequencies(SamplingParams()), PROBS, atol=0.015)


def test_temperature_sharpens_and_flattens() -> None:
    for temperature in (0.5, 2.0):
        expected = (torch.log(PROBS) / temperature).softmax(dim=-1)
        assert torch.allclose(frequencies(SamplingParams(temperature=temperature)), expected, atol=0.015)


def test_top_k_keeps_the_k_most_likely_in_proportion() -> None:
    freqs = frequencies(SamplingParams(top_k=3))
    assert freqs[3:].sum() == 0
    assert torch.allclose(freqs, renormalized([0, 1, 2]), atol=0.015)


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    freqs = frequencies(SamplingParams(top_p=0.7))  # 0.4 + 0.25 < 0.7, + 0.15 reaches it
    assert freqs[3:].sum() == 0
    assert torch.allclose(freqs, renormalized([0, 1, 2]), atol=0.015)


def test_min_p_drops_tokens_below_the_scaled_maximum() -> None:
    freqs = frequencies(SamplingParams(min_p=0.3))  # threshold 0.12: tokens 0, 1, 2 stay
    assert freqs[3:].sum() == 0
    assert torch.allclose(freqs, renormalized([0, 1, 2]), atol=0.015)


def test_mixed_batch_rows_keep_their_own_settings() -> None:
    params = [SamplingParams(top_k=1), SamplingParams(top_p=0.5), SamplingParams(temperature=0.0),
              SamplingParams(min_p=0.5)]
    num_draws = 500
    ids = sample(LOGITS.repeat(num_draws * 4, 1), params * num_draws).token_ids.view(num_draws, 4)
    assert (ids[:, 0] == 0).all() and (ids[:, 2] == 0).all()
    assert set(ids[:, 1].tolist()) <= {0, 1} and set(ids[:, 3].tolist()) <= {0, 1}


def test_logit_bias_and_banned_ids() -> None:
    assert sample(LOGITS, [SamplingParams(temperature=0.0, logit_bias=[(5, 100.0)])]).token_ids.tolist() == [5]
    assert sample(LOGITS, [SamplingParams(temperature=0.0)], banned=[[0, 1]]).token_ids.tolist() == [2]


def test_presence_and_frequency_penalties_push_away_repeated_tokens() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, 0] = 1.0
    params = SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.3)
    # Token 0 seen twice: 1 - 0.5 - 0.6 < 0; token 1 seen once: -0.8; others stay at 0.
    assert sample(logits, [params], output_token_ids=[[0, 0, 1]]).token_ids.tolist() == [2]
    assert sample(logits, [SamplingParams(temperature=0.0)], output_token_ids=[[0, 0]]).token_ids.tolist() == [0]


def test_repetition_penalty_divides_seen_positive_logits() -> None:
    logits = torch.tensor([[2.0, 1.5, -1.0, -3.0]])
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    assert sample(logits, [params], output_token_ids=[[0]]).token_ids.tolist() == [1]


def test_logprobs_are_the_log_softmax_with_top_tokens_and_rank() -> None:
    logits = torch.randn(3, 1000)
    params = [SamplingParams(temperature=0.0, num_logprobs=5), SamplingParams(num_logprobs=2), SamplingParams()]
    output = sample(logits, params)
    assert output.logprobs is not None and output.logprob_token_ids is not None and output.ranks is not None
    assert output.logprobs.shape == (3, 6)
    expected = logits.log_softmax(dim=-1)
    assert torch.allclose(output.logprobs[0, 1:], expected[0].topk(5).values)
    assert output.logprob_token_ids[0, 0] == output.token_ids[0] == expected[0].argmax()
    assert output.ranks[0] == 1
    chosen = output.token_ids[1]
    assert torch.isclose(output.logprobs[1, 0], expected[1, chosen])
    assert output.ranks[1] == int((expected[1] > expected[1, chosen]).sum()) + 1


def test_seeded_row_draws_the_same_alone_or_in_a_batch() -> None:
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=7)
    logits = torch.randn(1, 50)
    alone = [sample(logits, [params], generators={0: g}).token_ids.item()
             for g in [torch.Generator().manual_seed(7)] for _ in range(30)]
    generator = torch.Generator().manual_seed(7)
    crowd = torch.randn(8, 50)
    crowd[3] = logits[0]
    batch = [SamplingParams(temperature=1.0)] * 3 + [params] + [SamplingParams(top_k=5)] * 4
    together = [sample(crowd, batch, generators={3: generator}).token_ids[3].item() for _ in range(30)]
    assert alone == together


@pytest.mark.parametrize("draw", [0.0, 1.0 - 2**-24, 1.0])
def test_the_extreme_draws_land_on_tokens_with_mass(draw: float, monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: token 0 is banned and top_k leaves three: the first and last of those three bound the draws.
    monkeypatch.setattr("engine_proc.sampler.torch.rand", lambda *shape, **kwargs: torch.full(shape, draw))
    logits = torch.log(torch.tensor([[0.3, 0.3, 0.2, 0.1, 0.05, 0.05]]))
    (token_id,) = sample(logits, [SamplingParams(top_k=3)], banned=[[0]]).token_ids.tolist()
    assert token_id == (1 if draw == 0.0 else 3)


def test_sampling_a_long_vocabulary_follows_the_distribution() -> None:
    # NOTE: 49,152 ids as the default model's: mass in a few ids far apart, the rest nearly none.
    logits = torch.full((1, 49152), -30.0)
    logits[0, [5, 20000, 49151]] = torch.log(torch.tensor([0.5, 0.3, 0.2]))
    ids = torch.cat([sample(logits.repeat(500, 1), [SamplingParams()] * 500).token_ids for _ in range(10)])
    counts = torch.bincount(ids, minlength=49152).float() / len(ids)
    assert counts[[5, 20000, 49151]].sum() > 0.99  # the other 49,149 ids hold 49,149 * e^-30 of the mass
    assert torch.allclose(counts[[5, 20000, 49151]], torch.tensor([0.5, 0.3, 0.2]), atol=0.03)


def test_top_p_fast_path_and_sorted_fallback_agree() -> None:
    torch.manual_seed(0)
    peaked = torch.randn(4, 5000) * 8  # the nucleus sits within the top candidates
    flat = torch.randn(4, 5000) * 0.01  # it does not: these rows take the full sort
    logits = torch.cat([peaked, flat])
    top_p = torch.full((8,), 0.9)
    from engine_proc.sampler import _sorted_top_p, apply_top_p

    fast = apply_top_p(logits.clone(), top_p)
    assert torch.equal(fast.isinf(), _sorted_top_p(logits, top_p).isinf())


def test_greedy_rows_pick_the_same_ids_from_bfloat16_logits_as_from_float32() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 1000, generator=generator).bfloat16()
    params = [SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=False)] * 6
    banned = [[int(logits[row].float().argmax())] for row in range(6)]
    low = sample(logits, params, banned=banned).token_ids
    high = sample(logits.float(), params, banned=banned).token_ids
    assert torch.equal(low, high)
    assert all(low[row].item() != banned[row][0] for row in range(6))
