"""The structured-outputs benchmark states each ratio per round: the rounds' median and range."""

from __future__ import annotations

from benchmarks.structured_outputs import round_ratios, said


def test_a_ratio_is_the_median_of_the_rounds_ratios_with_their_range() -> None:
    # NOTE: the 2026-12-04 run's rounds: the ratio of its medians said 0.93, no round's own figure.
    ratios = round_ratios([0.78, 1.00, 0.86])
    assert (ratios["median"], ratios["min"], ratios["max"]) == (0.86, 0.78, 1.00)
    assert said(ratios) == "0.86 (rounds 0.78-1.00)"
    assert said(round_ratios([0.93])) == "0.93"
