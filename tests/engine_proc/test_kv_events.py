"""KV cache events as a router sees them: subscribed with pyzmq, decoded with msgpack, replayed to the
engine's exact set of cached blocks across evictions and a reset, told apart per engine."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import msgpack
import msgspec
import pytest
import zmq

from engine_proc.block_hash import external_block_hash
from engine_proc.core import EngineCore
from engine_proc.kv_cache_manager import KVCacheManager
from engine_proc.kv_events import KVEventPublisher, encode_batch, offset_endpoint
from engine_proc.request import Request
from proto.engine_config import EngineConfig, KVEventsConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from tests.engine_proc.kv_router import RECV_TIMEOUT_MS, apply_batch, replay
from tests.server_process import free_port, running_server

ROOT = Path(__file__).resolve().parents[2]
REQUEST_NUMBERS = itertools.count()
# NOTE: 12 blocks of 16 tokens (as in test_core.py): the workload below must evict.
TWELVE_BLOCKS_GIB = 12 * (2 * 2 * 16 * 2 * 16 * 4) / 2**30


def cached_hashes(manager: KVCacheManager) -> set[int]:
    return {external_block_hash(block_hash) for block_hash in manager.block_pool.cached_block_hashes}


def receive_by_engine(sub: zmq.Socket[Any], num_batches_of: dict[int, int]) -> dict[int, dict[int, bytes]]:
    """Batches on one SUB socket by engine (data_parallel_rank) and seq, up to each engine's last one
    (earlier ones may predate the subscription)."""
    by_engine: dict[int, dict[int, bytes]] = {engine_index: {} for engine_index in num_batches_of}
    while any(num - 1 not in by_engine[engine_index] for engine_index, num in num_batches_of.items()):
        assert sub.poll(RECV_TIMEOUT_MS), "an engine's last batch never came"
        _, seq_bytes, payload = sub.recv_multipart()
        by_engine[msgpack.unpackb(payload)[2]][int.from_bytes(seq_bytes, "big")] = payload
    return by_engine


def generate(core: EngineCore, prompts: list[list[int]], max_tokens: int) -> None:
    """Greedy requests, all submitted at once, run to the end."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for prompt in prompts:
        core.add_request(EngineCoreRequest(f"r{next(REQUEST_NUMBERS)}", prompt, params))
    while core.has_work:
        core.step()


def make_request(request_id: str, token_ids: list[int]) -> Request:
    return Request(EngineCoreRequest(request_id, token_ids, SamplingParams()), ())


def test_manager_events_replay_to_its_cached_blocks_across_evictions_and_a_reset() -> None:
    manager = KVCacheManager(num_blocks=6, block_size=4, enable_kv_cache_events=True)
    cached: set[int] = set()

    def admit_and_free(request_id: str, token_ids: list[int]) -> None:
        request = make_request(request_id, token_ids)
        prefix = manager.get_computed_blocks(request)
        manager.allocate(request, request.num_tokens - prefix.num_tokens, prefix)
        manager.free(request)
        apply_batch(cached, msgpack.unpackb(encode_batch(manager.take_kv_events(), 0.0, 0, "array")))
        assert cached == cached_hashes(manager)

    shared = list(range(8))
    admit_and_free("a", [*shared, 20, 21, 22, 23, 24])
    admit_and_free("b", [*shared, 30, 31, 32, 33])  # shares two blocks, stores one
    admit_and_free("c", list(range(100, 120)))  # five blocks of six: evicts
    admit_and_free("d", [*shared, 40])
    manager.reset_prefix_cache()
    apply_batch(cached, msgpack.unpackb(encode_batch(manager.take_kv_events(), 0.0, 0, "array")))
    assert cached == cached_hashes(manager) == set()
    admit_and_free("e", [*shared, 50, 51, 52, 53])
    assert len(cached) == 3


def test_a_stored_blocks_hash_is_recomputed_from_its_token_ids_as_documented() -> None:
    manager = KVCacheManager(num_blocks=8, block_size=4, enable_kv_cache_events=True)
    request = make_request("a", list(range(1000, 1013)))
    manager.allocate(request, request.num_tokens)
    [stored] = manager.take_kv_events()
    _, block_hashes, parent, token_ids, block_size, *_ = msgpack.unpackb(encode_batch([stored], 0.0, 0, "array"))[1][0]
    digest = hashlib.sha256(b"zeroserve-prefix-cache-v1").digest()
    recomputed = []
    for start in range(0, len(token_ids), block_size):
        block = token_ids[start : start + block_size]
        digest = hashlib.sha256(digest + b"".join(t.to_bytes(8, "little", signed=True) for t in block)).digest()
        recomputed.append(int.from_bytes(digest[-8:], "big"))
    assert parent is None and block_hashes == recomputed and len(recomputed) == 3


# NOTE: vLLM's event structs as its subscribers declare them, in both of vLLM's layouts: events as
# tagged arrays (`array_like=True`, vLLM until mid-2026) or tagged maps (since vllm-project/vllm#42892).
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


def vllm_event_types(array_like: bool) -> Any:
    """vLLM's BlockStored | BlockRemoved | AllBlocksCleared, in one layout."""

    class KVCacheEvent(msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[int | bytes]
        parent_block_hash: int | bytes | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None
        extra_keys: list[Any] | None = None
        group_idx: int | None = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[int | bytes]
        medium: str | None
        group_idx: int | None = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    return BlockStored | BlockRemoved | AllBlocksCleared


@pytest.mark.parametrize("event_format", ["array", "map"])
def test_vllms_own_msgspec_structs_decode_the_events(event_format: str) -> None:
    manager = KVCacheManager(num_blocks=3, block_size=4, enable_kv_cache_events=True)
    first = make_request("a", list(range(12)))
    manager.allocate(first, 12)
    manager.free(first)
    manager.allocate(make_request("b", list(range(50, 54))), 4)  # evicts a's last block (freed first)
    manager.reset_prefix_cache()
    payload = encode_batch(manager.take_kv_events(), 1.5, 3, event_format)
    batch = msgspec.msgpack.decode(payload, type=EventBatch)
    events_type = vllm_event_types(array_like=event_format == "array")
    events = [msgspec.convert(event, events_type) for event in batch.events]
    assert (batch.ts, batch.data_parallel_rank) == (1.5, 3)
    assert [type(event).__name__ for event in events] == ["BlockStored", "BlockRemoved", "BlockStored", "AllBlocksCleared"]
    stored, removed = events[0], events[1]
    assert stored.token_ids == list(range(12)) and stored.block_size == 4 and stored.medium == "GPU"
    assert removed.block_hashes == stored.block_hashes[-1:]


def test_events_are_off_unless_enabled() -> None:
    manager = KVCacheManager(num_blocks=4, block_size=4)
    manager.allocate(make_request("a", list(range(12))), 12)
    manager.reset_prefix_cache()
    assert manager.take_kv_events() == [] and manager.block_pool.evicted_hashes is None
    assert not EngineConfig().kv_events.is_publishing
    assert not KVEventsConfig(enable_kv_cache_events=True, publisher="null").is_publishing


@pytest.mark.parametrize(
    "text", [
        '{"enable_kv_cache_events": 1}', '{"publisher": "kafka"}', '{"hwm": 0}', '{"endpont": "x"}', "[]",
        '{"endpoint": "localhost:5557"}', '{"event_format": "json"}',
    ],
)
def test_a_bad_kv_events_config_is_refused_naming_the_key(text: str) -> None:
    pattern = "kv_events_config: .*(enable_kv_cache_events|kafka|hwm|endpont|object|endpoint|event_format)"
    with pytest.raises(ValueError, match=pattern):
        EngineConfig(kv_events_config=text)


def test_engine_n_offsets_the_endpoint_as_vllm_does() -> None:
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 2) == "tcp://*:5559"
    assert offset_endpoint("ipc:///tmp/kv", 1) == "ipc:///tmp/kv_dp1"
    with pytest.raises(ValueError, match="tcp://host:port"):
        offset_endpoint("tcp://*", 1)


def test_events_listen_on_loopback_unless_told_otherwise() -> None:
    assert KVEventsConfig().endpoint == "tcp://127.0.0.1:5557"
    assert "127.0.0.1" in EngineConfig(kv_events_config='{"enable_kv_cache_events": true}').kv_events.endpoint


@pytest.mark.parametrize(
    ("endpoint", "level", "says"), [
        ("tcp://127.0.0.1:{port}", logging.INFO, "listening for subscribers on tcp://127.0.0.1:{port}"),
        ("tcp://localhost:{port}", logging.INFO, "listening for subscribers on tcp://localhost:{port}"),
        ("tcp://*:{port}", logging.WARNING, "listening for subscribers on tcp://*:{port}: every interface, unauthenticated"),
        ("tcp://collector.invalid:{port}", logging.INFO, "connecting to a collector at tcp://collector.invalid:{port}"),
    ],
)
def test_the_log_says_whether_events_listen_or_connect(
    endpoint: str, level: int, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    caplog.set_level(logging.INFO, logger="engine_proc.kv_events")
    publisher = KVEventPublisher(KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint.format(port=port)), 0)
    publisher.close()
    [record] = [record for record in caplog.records if "KV cache events" in record.getMessage()]
    assert record.levelno == level and says.format(port=port) in record.getMessage(), record.getMessage()


def test_an_endpoint_another_engine_holds_fails_the_start_naming_the_setting() -> None:
    config = KVEventsConfig(enable_kv_cache_events=True, endpoint=f"tcp://*:{free_port()}")
    first = KVEventPublisher(config, engine_index=0)
    try:
        with pytest.raises(ValueError, match="--kv-events-config: cannot open tcp://"):
            KVEventPublisher(config, engine_index=0)
    finally:
        first.close()


def test_a_late_subscriber_gets_the_batches_it_missed_from_the_replay_socket(tmp_path: Path) -> None:
    config = KVEventsConfig(
        enable_kv_cache_events=True, endpoint=f"ipc://{tmp_path}/kv", replay_endpoint=f"ipc://{tmp_path}/replay",
        buffer_steps=3,
    )
    manager = KVCacheManager(num_blocks=8, block_size=4, enable_kv_cache_events=True)
    publisher = KVEventPublisher(config, engine_index=0)
    for i in range(5):
        manager.allocate(make_request(str(i), [i] * 4), 4)
        publisher.publish(manager.take_kv_events(), 0)
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        batches = replay(ctx, config.replay_endpoint or "", start_seq=1)
        assert sorted(batches) == [2, 3, 4]  # the last buffer_steps batches
        stored = [msgpack.unpackb(batches[seq])[1][0][1] for seq in (2, 3, 4)]
        assert stored == [[external_block_hash(manager.block_pool.blocks[i].block_hash or b"")] for i in (2, 3, 4)]
    finally:
        publisher.close()
        ctx.destroy(linger=0)


def test_two_engines_events_rebuild_each_engines_cached_blocks(tiny_model_dir: Path, tmp_path: Path) -> None:
    kv_events = {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{tmp_path}/kv",
        "replay_endpoint": f"ipc://{tmp_path}/replay", "topic": "kv-events",
    }
    config = EngineConfig(
        model_path=str(tiny_model_dir), kv_cache_memory_gib=TWELVE_BLOCKS_GIB, max_model_len=128,
        max_num_batched_tokens=32, kv_events_config=json.dumps(kv_events),
    )
    cores = [EngineCore(config, engine_index) for engine_index in (0, 1)]
    ctx: zmq.Context[Any] = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    for engine_index in (0, 1):
        sub.connect(offset_endpoint(kv_events["endpoint"], engine_index))
    try:
        system = list(range(200, 240))  # two and a half blocks every chat shares
        generate(cores[0], [system + [1, 2, 3], system + [4, 5], list(range(300, 360))], max_tokens=20)
        generate(cores[0], [system + [6], list(range(400, 470)), system + [1, 2, 3]], max_tokens=20)
        cores[0].reset_prefix_cache()
        generate(cores[0], [system + [7, 8], list(range(500, 530))], max_tokens=10)
        generate(cores[1], [list(range(600, 650))], max_tokens=5)
        stats = cores[0].get_stats()
        assert stats.num_prefix_cache_hits > 0

        publishers = [core.kv_event_publisher for core in cores]
        assert publishers[0] is not None and publishers[1] is not None
        received = receive_by_engine(sub, {i: publisher.num_batches for i, publisher in enumerate(publishers)})
        for core in cores:
            assert core.kv_event_publisher is not None
            replay_endpoint = offset_endpoint(kv_events["replay_endpoint"], core.engine_index)
            batches = {**replay(ctx, replay_endpoint, 0), **received[core.engine_index]}
            assert sorted(batches) == list(range(core.kv_event_publisher.num_batches))
            cached: set[int] = set()
            tags = []
            for seq in sorted(batches):
                batch = msgpack.unpackb(batches[seq])
                assert batch[2] == core.engine_index
                tags += [event[0] for event in batch[1]]
                apply_batch(cached, batch)
            assert cached == cached_hashes(core.scheduler.kv_cache_manager) and cached
            if core.engine_index == 0:
                assert {"BlockStored", "BlockRemoved", "AllBlocksCleared"} <= set(tags)
    finally:
        for core in cores:
            core.shutdown()
        ctx.destroy(linger=0)


def readme_subscriber() -> str:
    """The README's subscriber snippet, as printed."""
    blocks = re.findall(r"^```\w*\n(.*?)^```$", (ROOT / "README.md").read_text(), re.MULTILINE | re.DOTALL)
    [snippet] = [block for block in blocks if "zmq.SUBSCRIBE" in block]
    return str(snippet)


def readme_kv_events_config() -> str:
    """The README's --kv-events-config, as printed."""
    match = re.search(r"--kv-events-config\s+'(\{.*?\})'", (ROOT / "README.md").read_text(), re.DOTALL)
    assert match is not None
    return " ".join(match.group(1).split())


def test_the_readmes_subscriber_counts_an_engines_cached_blocks(tiny_model_dir: Path) -> None:
    port, replay_port = free_port(), free_port()
    kv_events = readme_kv_events_config().replace(":5557", f":{port}").replace(":5567", f":{replay_port}")
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05, kv_events_config=kv_events))
    script = readme_subscriber().replace(":5557", f":{port}")
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as subscriber:
        try:
            assert subscriber.stdout is not None
            # NOTE: a subscriber misses what is sent before it joins: requests go on until it prints.
            for prompt_number in range(60):
                generate(core, [[prompt_number] * 40], max_tokens=1)
                if select.select([subscriber.stdout], [], [], 0.5)[0]:
                    break
            else:
                pytest.fail(f"the README's subscriber heard nothing from {kv_events}")
            line = subscriber.stdout.readline()
            assert re.fullmatch(r"engine 0, batch \d+: [1-9]\d* blocks cached\n", line), line
        finally:
            subscriber.kill()
            core.shutdown()


def test_zeroserve_serves_each_engines_events_on_its_own_endpoint(tiny_model_dir: Path, tmp_path: Path) -> None:
    kv_events = {
        "enable_kv_cache_events": True, "endpoint": f"ipc://{tmp_path}/kv",
        "replay_endpoint": f"ipc://{tmp_path}/replay", "topic": "kv-events",
    }
    ctx: zmq.Context[Any] = zmq.Context()
    args = ("--served-model-name", "tiny", "--data-parallel-size", "2", "--kv-events-config", json.dumps(kv_events))
    try:
        with running_server(tiny_model_dir, *args) as server:
            for engine_index in (0, 1):
                body = {"model": "tiny", "prompt": "the same long prefix " * 20, "max_tokens": 2,
                        "data_parallel_rank": engine_index}
                response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
                assert response.status_code == 200, response.text
            for engine_index in (0, 1):
                replay_endpoint = offset_endpoint(kv_events["replay_endpoint"], engine_index)
                batches = [msgpack.unpackb(payload) for payload in replay(ctx, replay_endpoint, 0).values()]
                assert batches and {batch[2] for batch in batches} == {engine_index}
                cached: set[int] = set()
                for batch in batches:
                    apply_batch(cached, batch)
                assert cached
    finally:
        ctx.destroy(linger=0)
