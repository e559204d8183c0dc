"""ParentRequest: child ids and seeds."""

from __future__ import annotations

from service.frontend.parallel_sampling import ParentRequest
from service.frontend.sampling_params import SamplingParams


def test_children_get_distinct_reproducible_seeds_and_ids() -> None:
    parent = ParentRequest("req", SamplingParams(seed=10, n=3))
    assert [parent.child_sampling_params(i).seed for i in range(3)] == [10, 11, 12]
    assert len({parent.child_request_id(i) for i in range(3)}) == 3
    assert ParentRequest("req", SamplingParams(n=3)).child_sampling_params(2).seed is None
    assert ParentRequest("req", SamplingParams(seed=2**63 - 1, n=2)).child_sampling_params(1).seed == -(2**63)
    assert ParentRequest("solo", SamplingParams()).child_request_id(0) == "solo"
