"""Picks each sequence's next token from its logits, vectorized over the batch.

Order: logprobs of the raw logits (as vLLM reports them) → logit bias → bans (EOS and stop ids
before min_tokens) → penalties → greedy argmax, or temperature → min_p → top_k → top_p → draw.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from engine_proc.cpu.argmax import greedy_ids
from engine_proc.penalties import apply_penalties
from engine_proc.sampling_metadata import SamplingMetadata

_TOP_P_CANDIDATES = 256


class SamplerOutput(NamedTuple):
    """The sampled ids and, when asked, each row's logprobs (sampled token first, then the top ones)."""

    token_ids: torch.Tensor  # [num_seqs]
    logprob_token_ids: torch.Tensor | None  # [num_seqs, 1 + max_num_logprobs]
    logprobs: torch.Tensor | None  # [num_seqs, 1 + max_num_logprobs]
    ranks: torch.Tensor | None  # [num_seqs], 1 for the most likely token


class Sampler:
    """Greedy and random sampling with every OpenAI/vLLM knob; seeded rows use their own generator."""

    def __call__(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """logits [num_seqs, vocab] in any float dtype → one token id per row."""
        if metadata.is_plain_greedy:
            # NOTE: widening to float32 changes no value, so the model dtype's argmax is the
            # same, without a float32 copy of every row; bans (-inf) hold in any dtype.
            return SamplerOutput(greedy_ids(_apply_bias_and_bans(logits, metadata)), None, None, None)
        logits = logits.float()
        raw_logprobs = logits.log_softmax(dim=-1) if metadata.max_num_logprobs is not None else None
        logits = _apply_bias_and_bans(logits, metadata)
        if metadata.output_counts is not None:
            assert metadata.presence_penalty is not None and metadata.frequency_penalty is not None
            assert metadata.repetition_penalty is not None
            logits = apply_penalties(
                logits, metadata.output_counts, metadata.prompt_mask,
                metadata.presence_penalty, metadata.frequency_penalty, metadata.repetition_penalty,
            )
        token_ids = greedy_ids(logits)
        if not metadata.is_all_greedy:
            token_ids = _sample_rows(logits, token_ids, metadata)
        if raw_logprobs is None:
            return SamplerOutput(token_ids, None, None, None)
        assert metadata.max_num_logprobs is not None
        return _gather_logprobs(raw_logprobs, token_ids, metadata.max_num_logprobs)


def _apply_bias_and_bans(logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    if metadata.logit_bias is not None:
        rows, token_ids, biases = metadata.logit_bias
        logits = logits.index_put((rows, token_ids), biases, accumulate=True)
    if metadata.banned is not None:
        rows, token_ids = metadata.banned
        logits = logits.index_put((rows, token_ids), torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device))
    return logits


def _sample_rows(logits: torch.Tensor, greedy_token_ids: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
    """The greedy ids with the sampled rows' draws in place: only those rows pay for the
    filters, the softmax and the noise (a greedy row's knobs change nothing)."""
    rows = (~metadata.is_greedy).nonzero().squeeze(1)
    if rows.numel() == logits.shape[0]:
        return _sample(logits, metadata, None)
    token_ids = greedy_token_ids.clone()
    token_ids[rows] = _sample(logits[rows], metadata, rows)
    return token_ids


def _sample(logits: torch.Tensor, metadata: SamplingMetadata, rows: torch.Tensor | None) -> torch.Tensor:
    """One draw for each row of `logits`: the batch's rows `rows` (None: all of them)."""

    def of_rows(values: torch.Tensor) -> torch.Tensor:
        return values if rows is None else values[rows]

    logits = logits / of_rows(metadata.temperature).unsqueeze(1)
    if metadata.min_p is not None:
        logits = apply_min_p(logits, of_rows(metadata.min_p))
    if metadata.top_k is not None:
        logits = apply_top_k(logits, of_rows(metadata.top_k))
    if metadata.top_p is not None:
        logits = apply_top_p(logits, of_rows(metadata.top_p))
    probs = logits.softmax(dim=-1)
    # NOTE: the inverse of each row's CDF at one uniform draw: one random number a row (a seeded
    # row draws it from its own generator), where the exponential race (argmax p / E, E ~ Exp(1))
    # drew one a token: on one core, [16, 49152] in 0.8 ms against 18.5. A token of no mass never
    # ends a CDF step (adding 0 is exact), so it is never drawn.
    uniform = torch.rand(len(probs), 1, device=probs.device)
    if metadata.generators:
        batch_rows = range(len(probs)) if rows is None else rows.tolist()
        positions = {row: position for position, row in enumerate(batch_rows)}
        for row, generator in metadata.generators.items():
            uniform[positions[row]] = torch.rand(1, generator=generator, device=probs.device)
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]  # NOTE: also the CDF at the last token of any mass, exactly
    # NOTE: kept below the total where rounding would reach it, so the pick has mass.
    point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, point, right=True).squeeze(1)


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drops tokens less likely than min_p times the most likely one."""
    probs = logits.softmax(dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keeps each row's top_k highest logits (ties at the k-th value stay)."""
    max_k = int(top_k.max())
    top_values = logits.topk(max_k, dim=-1).values
    kth_largest = top_values.gather(1, (top_k - 1).unsqueeze(1))
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keeps the smallest set of most likely tokens whose mass reaches top_p.

    A full sort of the vocabulary dominates a CPU step, so each row first looks at its top
    `_TOP_P_CANDIDATES` tokens: when they already hold top_p of the mass, the nucleus is among
    them and its last probability is the threshold. Only other rows pay for the sort.
    """
    probs = logits.softmax(dim=-1)
    num_candidates = min(_TOP_P_CANDIDATES, logits.shape[-1])
    top_probs = probs.topk(num_candidates, dim=-1).values
    # Keep a token when the tokens ranked above it do not reach top_p yet.
    num_kept = ((top_probs.cumsum(dim=-1) - top_probs) < top_p.unsqueeze(1)).sum(dim=-1)
    # NOTE: a row with top_p 1 keeps every token (threshold 0), sorting nothing.
    is_everything = top_p >= 1.0
    is_covered = (num_kept < num_candidates) | is_everything
    threshold = top_probs.gather(1, (num_kept - 1).clamp(min=0).unsqueeze(1))
    threshold = threshold.masked_fill(is_everything.unsqueeze(1), 0.0)
    kept = logits.masked_fill(probs < threshold, float("-inf"))
    if not is_covered.all():
        rows = (~is_covered).nonzero().squeeze(1)
        kept[rows] = _sorted_top_p(logits[rows], top_p[rows])
    return kept


def _sorted_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.empty_like(logits).scatter_(1, sorted_ids, sorted_logits)


def _gather_logprobs(logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int) -> SamplerOutput:
    chosen = logprobs.gather(1, token_ids.unsqueeze(1))
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    top_values, top_ids = logprobs.topk(num_top, dim=-1) if num_top else (chosen[:, :0], token_ids[:, None][:, :0])
    return SamplerOutput(
        token_ids,
        torch.cat([token_ids.unsqueeze(1), top_ids], dim=1),
        torch.cat([chosen, top_values], dim=1),
        ranks,
    )
