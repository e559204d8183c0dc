"""Block bookkeeping."""

from __future__ import annotations

from engine_proc.kv_cache_manager import KVCacheManager
from engine_proc.request import Request
from proto.engine_input import EngineCoreRequest, SamplingParams


def test_allocate_grows_by_whole_blocks_and_free_returns_them() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=4)
    request = Request(EngineCoreRequest("r", [1] * 5, SamplingParams()), ())
    assert manager.can_allocate(request, 5)
    manager.allocate(request, 5)
    assert len(request.block_ids) == 2 and manager.num_free_blocks == 2
    request.num_computed_tokens = 5
    manager.allocate(request, 3)  # fits in the second block
    assert len(request.block_ids) == 2
    assert not manager.can_allocate(request, 20)
    manager.free(request)
    assert manager.num_free_blocks == 4 and request.block_ids == []
    assert manager.usage == 0.0
