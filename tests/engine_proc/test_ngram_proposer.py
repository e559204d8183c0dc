"""Prompt-lookup drafts: the longest earlier match of the context's suffix, then what followed it."""

from __future__ import annotations

import numpy as np

from engine_proc.ngram_proposer import NgramProposer


def propose(context: list[int], k: int = 3, lookup_min: int = 1, lookup_max: int = 3, **kwargs: int) -> list[int]:
    return NgramProposer(k, lookup_min, lookup_max).propose(np.array(context, dtype=np.int64), **kwargs)


def test_the_longest_match_wins_over_a_later_shorter_one() -> None:
    assert propose([1, 2, 3, 8, 9, 2, 3, 7, 1, 2, 3]) == [8, 9, 2]


def test_among_equally_long_matches_the_latest_wins() -> None:
    assert propose([1, 2, 3, 9, 2, 3, 7, 5, 2, 3]) == [7, 5, 2]


def test_a_match_too_close_to_the_end_for_every_draft_gives_way_to_an_earlier_one() -> None:
    # "1 2" ends at 2 and at 6; only "1 2" follows the later one, so the earlier one drafts.
    assert propose([7, 1, 2, 8, 9, 1, 2, 1, 2], k=3, lookup_max=2) == [8, 9, 1]


def test_no_earlier_occurrence_means_no_drafts() -> None:
    assert propose([1, 2, 3, 4, 5]) == []


def test_matches_shorter_than_the_minimum_are_ignored() -> None:
    assert propose([4, 7, 1, 2, 7], lookup_min=2) == []
    assert propose([4, 7, 1, 2, 7], lookup_min=1) == [1, 2, 7]


def test_drafts_stop_at_the_context_end_and_at_the_cap() -> None:
    assert propose([5, 6, 5], k=4) == [6, 5]
    assert propose([1, 2, 1, 2, 1], k=4) == [2, 1]  # "1 2 1" twice: the longest match wins
    assert propose([1, 2, 1, 2, 1], k=4, lookup_max=1) == [2, 1, 2, 1]
    assert propose([1, 2, 3, 4, 5, 1], k=4, max_num_tokens=2) == [2, 3]
    assert propose([1, 2, 3, 1], k=3, max_num_tokens=0) == []


def test_a_long_repeated_pattern_is_continued_in_phase() -> None:
    pattern = [11, 12, 13, 14, 15, 16]
    context = pattern * 20 + pattern[:2]
    assert propose(context, k=5, lookup_max=4) == pattern[2:] + pattern[:1]
