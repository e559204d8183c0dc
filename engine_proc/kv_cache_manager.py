"""Paged KV cache bookkeeping: which blocks of the cache each request owns, and which it shares.

    cache (one tensor per layer)      request A: block_ids [3, 0]      request B: [3, 1]
    ┌────────┬────────┬────────┬────────┬────────┐
    │ blk 0  │ blk 1  │ blk 2  │ blk 3  │ ...    │   token t of A lives in slot
    │ A 16-31│ B 16-31│ free   │ A,B 0-15│       │   block_ids[t // 16] * 16 + t % 16
    └────────┴────────┴────────┴────────┴────────┘

Prefix caching: every full block is indexed by a chained hash of the tokens up to its end
(`block_hash`), so B, whose first 16 tokens equal A's, takes block 3 from the index (ref
count 2) and computes only tokens 16 on. Freed blocks keep their hash until the pool hands
them out again, least recently freed first.

Plain Python, no torch: the scheduler asks `get_computed_blocks` for a new request's cached
prefix, then `can_allocate` / `allocate`, and `free`s finished requests' blocks at once.

NOTE: a request keeps every block of its context, those before a sliding window too: a model with
any global layer (Gemma 3, gpt-oss) reads them all. Only where every layer slides (Mistral v0.1, from
a folder: a GGUF carries no window) could they go back to the pool early, which would leave holes in
block tables that prefix caching (a prefix is its whole chain of blocks), preemption and the torch
attention path (it gathers whole tables) take as whole; not worth that for the one case.

With KV events on, every change to the set of cached hashes is recorded as it happens (blocks
stored, blocks evicted, all cleared) for the engine to publish after the step (engine_proc/kv_events.py).
"""

from __future__ import annotations

from typing import NamedTuple

from engine_proc.block_hash import extend_block_hashes, external_block_hash
from engine_proc.block_pool import BlockPool, KVCacheBlock
from engine_proc.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from engine_proc.request import Request
from proto.engine_config import EngineConfig


class CachedPrefix(NamedTuple):
    """The cached blocks a new request can reuse and how many of its tokens they hold."""

    blocks: list[KVCacheBlock]
    num_tokens: int


NO_CACHED_PREFIX = CachedPrefix([], 0)


class KVCacheManager:
    """Hands out fixed-size cache blocks to requests, reusing cached prefixes."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = EngineConfig.enable_prefix_caching,
        enable_kv_cache_events: bool = False,
    ) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_pool = BlockPool(num_blocks)
        # NOTE: None when KV events are off, so nothing accumulates that nobody takes.
        self._kv_events: list[KVCacheEvent] | None = [] if enable_kv_cache_events else None
        if enable_kv_cache_events:
            self.block_pool.evicted_hashes = []
        # request id → how many of its blocks are indexed in the prefix cache.
        self._num_hashed_blocks: dict[str, int] = {}
        self.num_prefix_queries = 0
        self.num_prefix_hits = 0

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of queried prompt tokens found in the cache since the engine started."""
        return self.num_prefix_hits / self.num_prefix_queries if self.num_prefix_queries else 0.0

    def get_computed_blocks(self, request: Request) -> CachedPrefix:
        """The longest run of cached full blocks that starts the request's tokens.

        NOTE: at most `num_tokens - 1` tokens: the last one must be computed so it samples.
        """
        # NOTE: prompt logprobs need every prompt position computed, so such requests skip the cache.
        if not self.enable_prefix_caching or request.sampling_params.num_prompt_logprobs is not None:
            return NO_CACHED_PREFIX
        extend_block_hashes(request.block_hashes, request.all_token_ids, self.block_size)
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        blocks = []
        for block_hash in request.block_hashes[:max_num_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return CachedPrefix(blocks, len(blocks) * self.block_size)

    def num_blocks_needed(
        self, request: Request, num_new_tokens: int, cached: CachedPrefix = NO_CACHED_PREFIX
    ) -> int:
        """Free-queue blocks that `allocate` would take, counting free cached blocks it revives."""
        num_tokens = request.num_computed_tokens + cached.num_tokens + num_new_tokens
        num_new_blocks = max(0, -(-num_tokens // self.block_size) - len(request.block_ids) - len(cached.blocks))
        if not cached.blocks:
            return num_new_blocks
        return num_new_blocks + sum(1 for block in cached.blocks if block.ref_cnt == 0)

    def can_allocate(
        self, request: Request, num_new_tokens: int, cached: CachedPrefix = NO_CACHED_PREFIX
    ) -> bool:
        return self.num_blocks_needed(request, num_new_tokens, cached) <= self.num_free_blocks

    def allocate(
        self, request: Request, num_new_tokens: int, cached: CachedPrefix = NO_CACHED_PREFIX
    ) -> None:
        """Gives `request` its cached prefix (if any) and enough blocks for `num_new_tokens` more.

        The full blocks this step fills are indexed at once. NOTE: that is safe within the
        step: the runner writes each layer's K/V for the whole batch before any attention reads.
        """
        if not self.can_allocate(request, num_new_tokens, cached):
            raise RuntimeError(f"out of KV cache blocks for request {request.request_id}")
        if not request.block_ids and self.enable_prefix_caching:
            self.num_prefix_queries += request.num_tokens
            self.num_prefix_hits += cached.num_tokens
        if cached.blocks:
            self.block_pool.touch(cached.blocks)
            request.block_ids.extend(block.block_id for block in cached.blocks)
            request.num_computed_tokens += cached.num_tokens
            request.num_cached_tokens = cached.num_tokens
        num_tokens = request.num_computed_tokens + num_new_tokens
        num_new_blocks = -(-num_tokens // self.block_size) - len(request.block_ids)
        if num_new_blocks > 0:
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
            request.block_ids.extend(block.block_id for block in new_blocks)
            self._record_evictions()
        if self.enable_prefix_caching:
            self._cache_full_blocks(request, num_tokens // self.block_size)

    def free(self, request: Request) -> None:
        """Returns the request's blocks; the last ones go first in eviction order."""
        blocks = self.block_pool.blocks
        self.block_pool.free_blocks(blocks[block_id] for block_id in reversed(request.block_ids))
        request.block_ids = []
        self._num_hashed_blocks.pop(request.request_id, None)

    def reset_prefix_cache(self) -> None:
        self.block_pool.reset_prefix_cache()
        if self._kv_events is not None:
            self._kv_events.append(AllBlocksCleared())

    def take_kv_events(self) -> list[KVCacheEvent]:
        """The KV events recorded since the last call, oldest first (none when events are off)."""
        if not self._kv_events:
            return []
        events, self._kv_events = self._kv_events, []
        return events

    def _record_evictions(self) -> None:
        evicted = self.block_pool.evicted_hashes
        if self._kv_events is not None and evicted:
            self._kv_events.append(BlockRemoved([external_block_hash(block_hash) for block_hash in evicted]))
            evicted.clear()

    def _cache_full_blocks(self, request: Request, num_full_blocks: int) -> None:
        num_hashed = self._num_hashed_blocks.get(request.request_id, 0)
        if num_full_blocks <= num_hashed:
            return
        extend_block_hashes(request.block_hashes, request.all_token_ids, self.block_size)
        num_full_blocks = min(num_full_blocks, len(request.block_hashes))
        blocks = self.block_pool.blocks
        stored_indexes = [
            index for index in range(num_hashed, num_full_blocks)
            if self.block_pool.cache_block(blocks[request.block_ids[index]], request.block_hashes[index])
        ]
        self._num_hashed_blocks[request.request_id] = num_full_blocks
        if self._kv_events is not None and stored_indexes:
            self._record_stored(request, stored_indexes)

    def _record_stored(self, request: Request, indexes: list[int]) -> None:
        """One BlockStored per run of consecutive newly cached blocks (a duplicate block ends a run)."""
        assert self._kv_events is not None
        runs: list[list[int]] = []
        for index in indexes:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        hashes, size = request.block_hashes, self.block_size
        for run in runs:
            first, end = run[0], run[-1] + 1
            self._kv_events.append(BlockStored(
                block_hashes=[external_block_hash(block_hash) for block_hash in hashes[first:end]],
                parent_block_hash=external_block_hash(hashes[first - 1]) if first > 0 else None,
                token_ids=list(request.all_token_ids[first * size : end * size]),
                block_size=size,
            ))
