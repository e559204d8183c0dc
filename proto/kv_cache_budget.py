"""The KV cache an engine takes when --kv-cache-memory is not given: declared here, where the engine
sizes its cache and a multi-model gateway expects what a model's engine will take, read alike."""

from __future__ import annotations

# NOTE: on a GPU the cache is the main tenant once the weights are loaded; on the CPU it
# shares RAM with everything else, and zeroing many GiB slows start-up for little gain.
GPU_FREE_MEMORY_FRACTION = 0.9
CPU_FREE_MEMORY_FRACTION = 0.25
CPU_MAX_DEFAULT_BYTES = 4 * 2**30


def available_ram_bytes() -> int:
    """The host's available RAM (MemAvailable of /proc/meminfo)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable missing from /proc/meminfo")


def default_kv_cache_bytes(free_bytes: int, is_gpu: bool) -> int:
    """The KV cache of an engine given no --kv-cache-memory, with `free_bytes` free on its device."""
    if is_gpu:
        return int(free_bytes * GPU_FREE_MEMORY_FRACTION)
    return min(int(free_bytes * CPU_FREE_MEMORY_FRACTION), CPU_MAX_DEFAULT_BYTES)
