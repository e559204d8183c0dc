"""What a real engine reports of the memory it holds, and the gateway's client keeping it current."""

from __future__ import annotations

import time
from pathlib import Path

from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.client.sync_mp_client import SyncMPClient

KV_CACHE_MEMORY_GIB = 0.05
_HEARTBEAT_WAIT_S = 30.0


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def huge_page_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no AnonHugePages")


def is_thp_on_request() -> bool:
    """Whether this kernel gives transparent huge pages to memory that asks (`madvise` or `always`)."""
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return path.exists() and "[never]" not in path.read_text()


def test_an_engine_reports_its_weights_kv_cache_and_peak_and_heartbeats_keep_the_peak_current(
    tiny_model_dir: Path,
) -> None:
    config = EngineConfig(
        model_path=str(tiny_model_dir), model_name="tiny", kv_cache_memory_gib=KV_CACHE_MEMORY_GIB,
        max_model_len=1024, max_num_batched_tokens=1024, num_threads=1,
    )
    client = SyncMPClient(config)
    try:
        ready = client.engine.ready
        assert ready.device == "cpu"
        assert ready.memory_bytes > ready.weight_bytes + ready.kv_cache_bytes > ready.kv_cache_bytes > 0
        # NOTE: a cache not yet written is not resident, but counts whole: a full one will be.
        assert ready.runtime_bytes > 0
        assert ready.memory_bytes >= ready.runtime_bytes + ready.weight_bytes + ready.kv_cache_bytes
        # NOTE: its malloc asks for huge pages: the weights and the cache stream through fewer TLB entries.
        assert b"glibc.malloc.hugetlb=1" in Path(f"/proc/{client.engine_pid}/environ").read_bytes()
        if is_thp_on_request():
            assert huge_page_bytes(client.engine_pid) > 0
        bytes_per_block = ready.kv_cache_bytes // ready.num_kv_blocks
        assert 0 <= int(KV_CACHE_MEMORY_GIB * 2**30) - ready.kv_cache_bytes < bytes_per_block

        # NOTE: a long prompt's step (one, unchunked) makes the engine hold more than it did when it joined.
        client.add_request(EngineCoreRequest("long", list(range(1, 1000)), SamplingParams(max_tokens=2)))
        while not any(output.is_finished for output in client.get_output().outputs):
            pass
        resident = resident_bytes(client.engine_pid)
        deadline = time.monotonic() + _HEARTBEAT_WAIT_S
        while client.memory_bytes < resident and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.memory_bytes >= resident
    finally:
        client.shutdown()
