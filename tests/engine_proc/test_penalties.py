"""TokenCounts grows with each new output token; penalties read it."""

from __future__ import annotations

import torch

from engine_proc.penalties import TokenCounts, apply_penalties
from engine_proc.request import Request
from proto.engine_input import EngineCoreRequest, SamplingParams


def make_request(request_id: str, params: SamplingParams) -> Request:
    return Request(EngineCoreRequest(request_id, [1, 2], params), eos_token_ids=(0,))


def test_counts_follow_new_tokens_and_skip_unpenalized_rows() -> None:
    counts = TokenCounts(vocab_size=6, device=torch.device("cpu"))
    penalized = make_request("a", SamplingParams(frequency_penalty=1.0, repetition_penalty=1.5))
    plain = make_request("b", SamplingParams())
    penalized.append_output_token(3)
    assert counts.output_counts([penalized, plain]).tolist() == [[0, 0, 0, 1, 0, 0], [0] * 6]
    penalized.append_output_token(3)
    penalized.append_output_token(5)
    assert counts.output_counts([penalized]).tolist() == [[0, 0, 0, 2, 0, 1]]
    assert counts.prompt_mask([penalized, plain]).tolist() == [
        [False, True, True, False, False, False], [False] * 6
    ]
    counts.free("a")
    assert counts.output_counts([penalized]).tolist() == [[0, 0, 0, 2, 0, 1]]  # rebuilt from scratch


def test_repetition_penalty_covers_prompt_tokens() -> None:
    logits = torch.tensor([[2.0, 2.0, -1.0]])
    out = apply_penalties(
        logits, torch.zeros(1, 3), torch.tensor([[True, False, True]]),
        torch.zeros(1), torch.zeros(1), torch.tensor([2.0]),
    )
    assert out.tolist() == [[1.0, 2.0, -2.0]]
