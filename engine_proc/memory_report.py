"""How much memory the engine holds: its peak so far, its weights' and its KV cache's tensors, and what it
holds at most once its KV cache is full (a multi-model gateway's budget counts that)."""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable

import torch

from proto.handshake import EngineReady


def peak_memory_bytes(device: str) -> int:
    """The most this process has held so far: on a GPU `device`, what the CUDA caching allocator
    reserved at its peak; on the CPU, the process's peak resident memory."""
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_reserved(torch.device(device)))
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    # NOTE: no /proc (macOS, BSD): ru_maxrss is in bytes on macOS, in KiB elsewhere.
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max_rss if sys.platform == "darwin" else max_rss * 1024


def resident_bytes() -> int:
    """This process's resident memory now (its peak where /proc is not)."""
    current = _status_bytes("VmRSS")
    return current if current is not None else peak_memory_bytes("cpu")


def committed_memory_bytes(ready: EngineReady) -> int:
    """The most the engine holds: its peak so far, or on the CPU, if more, its runtime, weights and whole KV
    cache (a CPU cache's pages are resident only once written: a full cache holds them all); a GPU's cache
    is reserved whole at its start, so its peak already counts it."""
    peak = peak_memory_bytes(ready.device)
    if ready.device.startswith("cuda"):
        return peak
    return max(peak, ready.runtime_bytes + ready.weight_bytes + ready.kv_cache_bytes)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes the storages of `tensors` hold, each storage once (views and shared weights are not
    counted twice; those on the meta device, freed or never loaded, hold none)."""
    storages: dict[tuple[torch.device, int], int] = {}
    for tensor in tensors:
        if tensor.is_meta:
            continue
        if tensor.is_mkldnn:  # NOTE: oneDNN's own layout (a packed bfloat16 weight) has no storage to read
            storages[(tensor.device, id(tensor))] = tensor.nbytes
            continue
        storage = tensor.untyped_storage()
        storages[(tensor.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())


def device_name(device: torch.device) -> str:
    """`device` as the engine reports it: "cpu", or a CUDA device with its index ("cuda:0")."""
    if device.type == "cuda" and device.index is None:
        return f"cuda:{torch.cuda.current_device()}"
    return str(device)


def _status_bytes(field: str) -> int | None:
    """A "<field>: <n> kB" line of /proc/self/status in bytes, or None where Linux's /proc is not."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith(f"{field}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
