"""SamplingParams validation."""

from __future__ import annotations

import math

import pytest

from proto.engine_input import SamplingParams


@pytest.mark.parametrize(
    "kwargs",
    [{"temperature": -1.0}, {"temperature": math.nan}, {"top_p": 0.0}, {"top_p": 1.5},
     {"top_k": 0}, {"max_tokens": 0}],
)
def test_bad_sampling_params_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_greedy_detection() -> None:
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(temperature=0.7, top_k=1).is_greedy
    assert not SamplingParams(temperature=0.7).is_greedy
