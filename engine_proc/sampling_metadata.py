"""One step's sampling parameters as batch tensors, built once per step for the sampler."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from proto.engine_input import SamplingParams


@dataclass
class SamplingMetadata:
    """Per-row sampling settings of a batch; optional tensors are None when no row uses them."""

    temperature: torch.Tensor  # [num_seqs], 1.0 on greedy rows
    is_greedy: torch.Tensor  # [num_seqs] bool
    is_all_greedy: bool
    top_k: torch.Tensor | None  # [num_seqs] long, vocab_size when unlimited
    top_p: torch.Tensor | None  # [num_seqs]
    min_p: torch.Tensor | None  # [num_seqs]
    presence_penalty: torch.Tensor | None  # [num_seqs]
    frequency_penalty: torch.Tensor | None  # [num_seqs]
    repetition_penalty: torch.Tensor | None  # [num_seqs]
    output_counts: torch.Tensor | None  # [num_seqs, vocab] float
    prompt_mask: torch.Tensor | None  # [num_seqs, vocab] bool
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # rows, token ids, biases
    banned: tuple[torch.Tensor, torch.Tensor] | None  # rows, token ids (min_tokens not reached)
    generators: dict[int, torch.Generator]
    max_num_logprobs: int | None

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        banned_ids: Sequence[Sequence[int]],
        generators: dict[int, torch.Generator],
        vocab_size: int,
        device: torch.device,
        output_counts: Callable[[], torch.Tensor],
        prompt_mask: Callable[[], torch.Tensor],
    ) -> SamplingMetadata:
        """`banned_ids` are the ids each row may not emit yet (EOS and stop ids before min_tokens);
        `output_counts` and `prompt_mask` are called only when some row has penalties."""

        def column(values: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        is_greedy = [p.is_greedy for p in params]
        has_penalties = any(p.has_penalties for p in params)
        has_repetition = any(p.repetition_penalty != 1.0 for p in params)
        num_logprobs = [p.num_logprobs for p in params if p.num_logprobs is not None]
        return cls(
            temperature=column([1.0 if g else p.temperature for p, g in zip(params, is_greedy, strict=False)]),
            is_greedy=column(is_greedy, torch.bool),
            is_all_greedy=all(is_greedy),
            top_k=(
                column([min(p.top_k or vocab_size, vocab_size) for p in params], torch.long)
                if any(p.top_k is not None for p in params) else None
            ),
            top_p=column([p.top_p for p in params]) if any(p.top_p < 1.0 for p in params) else None,
            min_p=column([p.min_p for p in params]) if any(p.min_p > 0.0 for p in params) else None,
            presence_penalty=column([p.presence_penalty for p in params]) if has_penalties else None,
            frequency_penalty=column([p.frequency_penalty for p in params]) if has_penalties else None,
            repetition_penalty=column([p.repetition_penalty for p in params]) if has_penalties else None,
            output_counts=output_counts() if has_penalties else None,
            prompt_mask=prompt_mask() if has_repetition else None,
            logit_bias=_sparse([p.logit_bias for p in params], device),
            banned=_banned(banned_ids, device),
            generators=generators,
            max_num_logprobs=max(num_logprobs) if num_logprobs else None,
        )

    @property
    def is_plain_greedy(self) -> bool:
        """Every row takes the argmax of its raw logits, bans aside: no logprobs, penalties or bias."""
        return (
            self.is_all_greedy and self.max_num_logprobs is None and self.output_counts is None
            and self.logit_bias is None
        )


def _sparse(
    biases: Sequence[Sequence[tuple[int, float]]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    entries = [(row, token_id, bias) for row, pairs in enumerate(biases) for token_id, bias in pairs]
    if not entries:
        return None
    rows, token_ids, values = zip(*entries, strict=False)
    return (
        torch.tensor(rows, device=device),
        torch.tensor(token_ids, device=device),
        torch.tensor(values, dtype=torch.float32, device=device),
    )


def _banned(banned_ids: Sequence[Sequence[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    entries = [(row, token_id) for row, ids in enumerate(banned_ids) for token_id in ids]
    if not entries:
        return None
    rows, token_ids = zip(*entries, strict=False)
    return torch.tensor(rows, device=device), torch.tensor(token_ids, device=device)
