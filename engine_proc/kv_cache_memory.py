"""How many KV cache blocks fit in the memory budget (given, or derived from free memory)."""

from __future__ import annotations

import ctypes
import gc
import logging
import sys

import torch

from proto.kv_cache_budget import available_ram_bytes, default_kv_cache_bytes

logger = logging.getLogger(__name__)


def free_memory_bytes(device: torch.device) -> int:
    """Free memory on `device`: the GPU's free memory, or the host's available RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    return available_ram_bytes()


def kv_cache_bytes(kv_cache_memory_gib: float | None, device: torch.device) -> int:
    """The budget given in GiB, or a share of free memory when none is given."""
    if kv_cache_memory_gib is not None:
        return int(kv_cache_memory_gib * 2**30)
    return default_kv_cache_bytes(free_memory_bytes(device), device.type == "cuda")


def num_kv_blocks(kv_cache_memory_gib: float | None, bytes_per_block: int, device: torch.device) -> int:
    budget = kv_cache_bytes(kv_cache_memory_gib, device)
    num_blocks = budget // bytes_per_block
    if num_blocks < 1:
        raise ValueError(f"a KV cache budget of {budget} bytes holds no block of {bytes_per_block} bytes")
    logger.info("KV cache: %.2f GiB, %d blocks", num_blocks * bytes_per_block / 2**30, num_blocks)
    return num_blocks


def release_memory(device: torch.device) -> None:
    """Hands freed tensor memory back to the system (the CUDA caching allocator, or malloc)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif sys.platform.startswith("linux"):
        ctypes.CDLL(None).malloc_trim(0)
