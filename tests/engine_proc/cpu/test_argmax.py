from __future__ import annotations

import pytest
import torch

from engine_proc.cpu.argmax import greedy_ids


@pytest.mark.parametrize("vocab_size", [7, 128, 300, 49152, 49152 + 77])
def test_greedy_ids_are_the_first_maximum_of_each_row(vocab_size: int) -> None:
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(9, vocab_size, generator=generator)
    # Ties: the first maximum wins, in a block, across blocks and against the tail.
    logits[1, [3, vocab_size - 1]] = 100.0
    logits[2, :] = 5.0
    logits[3, :] = float("-inf")
    logits[4, vocab_size - 1] = 50.0
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        typed = logits.to(dtype)
        assert torch.equal(greedy_ids(typed), typed.max(dim=-1).indices), dtype
        assert greedy_ids(typed)[1].item() == 3 and greedy_ids(typed)[2].item() == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_greedy_ids_of_rows_with_no_positive_logit(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(1)
    logits = -torch.rand(5, 1000, generator=generator).to(dtype) - 0.5
    logits[1, 10] = 0.0
    logits[2, :] = float("-inf")
    logits[3, 600] = -0.01
    logits[4, 999] = 3.0
    assert torch.equal(greedy_ids(logits), logits.max(dim=-1).indices)


@pytest.mark.parametrize("vocab_size", [5, 16, 49152, 49152 + 77])
def test_greedy_ids_of_bfloat16_rows_with_infinities_nans_and_signed_zeros(vocab_size: int) -> None:
    """The C++ kernels' bfloat16 argmax where they run (torch's ops elsewhere): torch's picks, NaN the largest."""
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(8, vocab_size, generator=generator).bfloat16()
    logits[0, vocab_size // 2] = float("inf")
    logits[1, vocab_size - 1] = float("nan")
    logits[2, :] = float("-inf")
    logits[3, :] = -1.0
    logits[3, [1, vocab_size - 2]] = torch.tensor([-0.0, 0.0]).bfloat16()
    logits[4, :] = 0.0
    logits[4, 2] = -0.0
    logits[5, [0, vocab_size - 1]] = float("-inf")
    logits[6, [2, 3]] = float("nan")
    logits[6, 1] = float("inf")
    assert torch.equal(greedy_ids(logits), logits.max(dim=-1).indices)
