"""Block bookkeeping and the prefix cache."""

from __future__ import annotations

from engine_proc.kv_cache_manager import KVCacheManager
from engine_proc.request import Request
from proto.engine_input import EngineCoreRequest, SamplingParams


def make_request(request_id: str, token_ids: list[int]) -> Request:
    return Request(EngineCoreRequest(request_id, token_ids, SamplingParams()), ())


def admit(manager: KVCacheManager, request: Request) -> int:
    """Admits a new request whole; returns how many of its tokens came from the cache."""
    cached = manager.get_computed_blocks(request)
    manager.allocate(request, request.num_tokens - cached.num_tokens, cached)
    return cached.num_tokens


def test_allocate_grows_by_whole_blocks_and_free_returns_them() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=4)
    request = make_request("r", [1] * 5)
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


def test_shared_prefix_reuses_blocks_and_computes_only_the_rest() -> None:
    manager = KVCacheManager(num_blocks=16, block_size=4)
    first = make_request("a", list(range(10)) + [50, 51])
    assert admit(manager, first) == 0
    second = make_request("b", list(range(10)) + [60, 61, 62])
    assert admit(manager, second) == 8  # two full shared blocks; token 8-9 share a partial block
    assert second.num_computed_tokens == 8
    assert second.block_ids[:2] == first.block_ids[:2]
    assert manager.block_pool.blocks[first.block_ids[0]].ref_cnt == 2
    manager.free(first)
    manager.free(second)
    assert manager.num_free_blocks == 16
    assert manager.prefix_cache_hit_rate == 8 / 25


def test_identical_prompt_still_computes_its_last_token() -> None:
    manager = KVCacheManager(num_blocks=16, block_size=4)
    admit(manager, make_request("a", list(range(8))))
    again = make_request("b", list(range(8)))
    cached = manager.get_computed_blocks(again)
    assert cached.num_tokens == 4  # not 8: the last token must run to sample


def test_freed_blocks_stay_cached_until_evicted_least_recently_freed_first() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=4)
    old, new = make_request("old", list(range(100, 109))), make_request("new", list(range(200, 209)))
    admit(manager, old)  # 3 blocks, 2 of them full and cached
    manager.free(old)
    admit(manager, new)  # takes the one never-used block, then evicts old's blocks
    manager.free(new)
    assert manager.num_free_blocks == 4
    # old's first block was freed longest ago but its last one goes first (tail blocks evict first);
    # new needed 3 blocks, so only old's first full block survives.
    assert admit(manager, make_request("old2", list(range(100, 109)))) == 4
    manager.reset_prefix_cache()
    assert manager.block_pool.num_cached_blocks == 0


def test_prefix_caching_off_never_shares() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    admit(manager, make_request("a", list(range(9))))
    assert admit(manager, make_request("b", list(range(9)))) == 0
    assert manager.num_free_blocks == 2
