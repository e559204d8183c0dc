"""n > 1 by fan-out: one parent request, n child engine requests."""

from __future__ import annotations

from proto import engine_input
from service.frontend.sampling_params import SamplingParams

_INT64 = 2**63


class ParentRequest:
    """An API request's n samples: each child has its own id and, when seeded, its own seed."""

    def __init__(self, request_id: str, sampling_params: SamplingParams) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.n = sampling_params.n

    def child_request_id(self, index: int) -> str:
        return self.request_id if self.n == 1 else f"{self.request_id}-{index}"

    def child_sampling_params(self, index: int) -> engine_input.SamplingParams:
        """What child i's engine request samples with: a request seeded s draws with seed s + i,
        distinct and the same every time."""
        seed = self.sampling_params.seed
        if seed is None or index == 0:
            return self.sampling_params.engine_params()
        return self.sampling_params.engine_params(seed=(seed + index + _INT64) % (2 * _INT64) - _INT64)
