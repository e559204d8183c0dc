"""Request send times: all at once, or gamma gaps whose mean is 1/rate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.bench.arrivals import arrival_offsets


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_offsets(4, math.inf, 1.0, seed=0) == [0.0] * 4


@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_gaps_average_one_over_the_rate_and_burstiness_sets_their_spread(burstiness: float) -> None:
    offsets = arrival_offsets(20_001, request_rate=10.0, burstiness=burstiness, seed=1)
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    # NOTE: a gamma of shape k has coefficient of variation 1/sqrt(k).
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_the_seed_fixes_the_schedule() -> None:
    assert arrival_offsets(5, 2.0, 1.0, seed=3) == arrival_offsets(5, 2.0, 1.0, seed=3)
    assert arrival_offsets(5, 2.0, 1.0, seed=3) != arrival_offsets(5, 2.0, 1.0, seed=4)
