"""Paged attention against dense causal attention over each sequence's whole K/V."""

from __future__ import annotations

import pytest
import torch

from tests.engine_proc.attention_cases import decode_step


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [3, 3], [1, 4, 2, 3], [5]])
def test_decodes_with_draft_tokens_attend_like_dense_causal_attention(query_lens: list[int]) -> None:
    out, expected = decode_step(query_lens)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
