"""When each request of a run is sent: all at once, or a Poisson / gamma arrival process."""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(num_requests: int, request_rate: float, burstiness: float, seed: int) -> list[float]:
    """Send times in seconds from the start, the first at 0.

    Gaps are gamma-distributed with shape `burstiness` and mean 1/request_rate, as in
    vLLM: burstiness 1 is a Poisson process, lower is burstier, higher is more regular.
    An infinite rate sends everything at once.
    """
    if math.isinf(request_rate):
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=max(0, num_requests - 1))
    return [0.0, *np.cumsum(gaps).tolist()][:num_requests]
