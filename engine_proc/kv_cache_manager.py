"""Paged KV cache bookkeeping: which blocks of the cache each request owns.

    cache (one tensor per layer)      request A: block_ids [3, 0]      request B: [1]
    ┌────────┬────────┬────────┬────────┬────────┐
    │ blk 0  │ blk 1  │ blk 2  │ blk 3  │ ...    │   token t of A lives in slot
    │ A 16-31│ B 0-15 │ free   │ A 0-15 │        │   block_ids[t // 16] * 16 + t % 16
    └────────┴────────┴────────┴────────┴────────┘

Plain Python, no torch: the scheduler asks `can_allocate` then `allocate`, and `free`s
finished requests' blocks at once.
"""

from __future__ import annotations

from collections import deque

from engine_proc.request import Request


class KVCacheManager:
    """Hands out fixed-size cache blocks to requests."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free_block_ids: deque[int] = deque(range(num_blocks))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_block_ids)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_blocks

    def num_blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        num_tokens = request.num_computed_tokens + num_new_tokens
        num_required = -(-num_tokens // self.block_size)
        return max(0, num_required - len(request.block_ids))

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.num_blocks_needed(request, num_new_tokens) <= self.num_free_blocks

    def allocate(self, request: Request, num_new_tokens: int) -> None:
        """Gives `request` enough blocks to hold `num_new_tokens` more tokens."""
        num_needed = self.num_blocks_needed(request, num_new_tokens)
        if num_needed > self.num_free_blocks:
            raise RuntimeError(f"out of KV cache blocks for request {request.request_id}")
        request.block_ids.extend(self._free_block_ids.popleft() for _ in range(num_needed))

    def free(self, request: Request) -> None:
        self._free_block_ids.extend(request.block_ids)
        request.block_ids = []
