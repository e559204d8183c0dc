"""Prefix-cache keys: each full block's hash chains its parent's, so equal hashes mean equal prefixes."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

# NOTE: a fixed root, not Python's hash(): keys must be the same in every process and run.
ROOT_BLOCK_HASH = hashlib.sha256(b"zeroserve-prefix-cache-v1").digest()


def hash_block(parent_hash: bytes, token_ids: Sequence[int], extra_keys: bytes = b"") -> bytes:
    """sha256 over the parent's hash, the block's token ids as packed int64 and any extra keys."""
    hasher = hashlib.sha256(parent_hash)
    hasher.update(array("q", token_ids).tobytes())
    if extra_keys:
        hasher.update(extra_keys)
    return hasher.digest()


def extend_block_hashes(
    block_hashes: list[bytes], token_ids: Sequence[int], block_size: int, extra_keys: bytes = b""
) -> None:
    """Appends the hashes of the full blocks of `token_ids` not yet in `block_hashes`."""
    num_full_blocks = len(token_ids) // block_size
    parent = block_hashes[-1] if block_hashes else ROOT_BLOCK_HASH
    for index in range(len(block_hashes), num_full_blocks):
        start = index * block_size
        parent = hash_block(parent, token_ids[start : start + block_size], extra_keys)
        block_hashes.append(parent)


def external_block_hash(block_hash: bytes) -> int:
    """A block's hash as KV events carry it: the digest's last 8 bytes, big-endian (vLLM's integer form)."""
    return int.from_bytes(block_hash[-8:], "big")
