"""Prefix-cache keys are chained and the same in every process."""

from __future__ import annotations

import subprocess
import sys

from engine_proc.block_hash import ROOT_BLOCK_HASH, extend_block_hashes, hash_block


def test_hashes_chain_so_equal_blocks_after_different_prefixes_differ() -> None:
    first: list[bytes] = []
    second: list[bytes] = []
    extend_block_hashes(first, [1, 2, 3, 4, 5, 6, 7, 8, 9], block_size=4)
    extend_block_hashes(second, [0, 2, 3, 4, 5, 6, 7, 8], block_size=4)
    assert len(first) == 2 and len(second) == 2  # only full blocks
    assert first[0] != second[0] and first[1] != second[1]
    assert first[1] == hash_block(hash_block(ROOT_BLOCK_HASH, [1, 2, 3, 4]), [5, 6, 7, 8])
    assert hash_block(ROOT_BLOCK_HASH, [1, 2], b"salt") != hash_block(ROOT_BLOCK_HASH, [1, 2])


def test_hashes_are_stable_across_processes() -> None:
    code = "from engine_proc.block_hash import ROOT_BLOCK_HASH, hash_block; print(hash_block(ROOT_BLOCK_HASH, [1, 2, 3]).hex())"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == hash_block(ROOT_BLOCK_HASH, [1, 2, 3]).hex()
