"""The pool of KV cache blocks: reference counts, an LRU free queue and the prefix-cache index.

    free queue (LRU first)         ┌─ evicted first: freed longest ago, tail blocks first
    [blk 7 #a1] [blk 2] [blk 9 #c4] ...
    prefix-cache index: {#a1: blk 7, #c4: blk 9, #e0: blk 3 (in use, ref_cnt 2)}

A block with `ref_cnt == 0` sits in the free queue but keeps its hash, so a later request
with the same prefix can take it back; it loses the hash only when it is handed out anew.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class KVCacheBlock:
    """One block of the cache: how many requests use it, and the hash of its tokens once full."""

    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None


class BlockPool:
    """Hands out blocks, takes them back, and finds full blocks by hash."""

    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVCacheBlock(block_id) for block_id in range(num_blocks)]
        # NOTE: an OrderedDict gives O(1) removal from the middle when a cached block is hit.
        self._free_blocks: OrderedDict[int, KVCacheBlock] = OrderedDict(
            (block.block_id, block) for block in self.blocks
        )
        self._cached_blocks: dict[bytes, KVCacheBlock] = {}
        # NOTE: the hashes evicted since the KV cache manager last took them; None: not kept (no KV events).
        self.evicted_hashes: list[bytes] | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_blocks)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached_blocks)

    @property
    def cached_block_hashes(self) -> set[bytes]:
        return set(self._cached_blocks)

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        return self._cached_blocks.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Takes a reference on cached blocks, pulling free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free_blocks[block.block_id]
            block.ref_cnt += 1

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Takes the least recently freed blocks, evicting their cached contents."""
        if num_blocks > self.num_free_blocks:
            raise RuntimeError(f"asked for {num_blocks} blocks, {self.num_free_blocks} free")
        blocks = []
        for _ in range(num_blocks):
            _, block = self._free_blocks.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            blocks.append(block)
        return blocks

    def cache_block(self, block: KVCacheBlock, block_hash: bytes) -> bool:
        """Indexes a full block (True); a duplicate of an already cached block stays unindexed (False)."""
        if block.block_hash is None and block_hash not in self._cached_blocks:
            block.block_hash = block_hash
            self._cached_blocks[block_hash] = block
            return True
        return False

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drops a reference; blocks nobody uses join the free queue's tail, in the given order."""
        for block in blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free_blocks[block.block_id] = block

    def reset_prefix_cache(self) -> None:
        """Forgets every cached hash; blocks in use keep their contents but are no longer shared."""
        for block in self._cached_blocks.values():
            block.block_hash = None
        self._cached_blocks.clear()

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            del self._cached_blocks[block.block_hash]
            if self.evicted_hashes is not None:
                self.evicted_hashes.append(block.block_hash)
            block.block_hash = None
