"""Draft tokens by prompt lookup: continue the context the way its last n-gram went on before.

    context  … the cat sat on the mat . the cat sat ?      last 3 tokens: "the cat sat"
                   └──────────┘ └───────┘                 seen before, followed by "on the mat"
    drafts   on the mat                                    the model checks all three in one step

The model verifies drafts in the same forward that computes the request's next token, so a
step yields 1 + (number of leading drafts the model agrees with) tokens, and greedy outputs
are exactly those of plain decoding. Repetitive text (code edits, lists, quoting the
prompt, a small model looping) is where drafts hit.
"""

from __future__ import annotations

import numpy as np


class NgramProposer:
    """Finds the longest earlier match (of prompt_lookup_min..max tokens) of the context's suffix."""

    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens
        self.prompt_lookup_min = prompt_lookup_min
        self.prompt_lookup_max = prompt_lookup_max

    def propose(self, token_ids: np.ndarray, max_num_tokens: int | None = None) -> list[int]:
        """Up to `num_speculative_tokens` (and `max_num_tokens`) drafts to follow `token_ids`; [] when no match.

        Of the matches of the longest suffix found, the latest that is followed by enough
        tokens wins (it is the freshest pattern). Vectorized: one comparison over the context finds where the last token
        occurred, then each longer suffix only checks those places.
        """
        num_drafts = self.num_speculative_tokens if max_num_tokens is None else min(
            self.num_speculative_tokens, max_num_tokens
        )
        length = token_ids.shape[0]
        if num_drafts <= 0 or length < self.prompt_lookup_min + 1:
            return []
        # NOTE: candidate ends j < length - 1, so each has a next token at j + 1.
        ends = np.flatnonzero(token_ids[: length - 1] == token_ids[length - 1])
        if ends.size == 0:
            return []
        match_lens = np.ones(ends.shape, dtype=np.int64)
        is_extending = np.ones(ends.shape, dtype=bool)
        for offset in range(1, min(self.prompt_lookup_max, length - 1)):
            positions = ends - offset
            is_extending &= positions >= 0
            is_extending[is_extending] &= token_ids[positions[is_extending]] == token_ids[length - 1 - offset]
            if not is_extending.any():
                break
            match_lens += is_extending
        best_len = int(match_lens.max())
        if best_len < self.prompt_lookup_min:
            return []
        starts = ends[match_lens == best_len] + 1
        # NOTE: the latest with room for every draft; failing that the earliest, which has the most.
        is_roomy = starts + num_drafts <= length
        start = int(starts[is_roomy][-1] if is_roomy.any() else starts[0])
        return token_ids[start : start + num_drafts].tolist()
