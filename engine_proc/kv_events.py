"""KV cache events in vLLM's wire format, published over ZeroMQ for prefix-aware routers.

Routers that score pods by the prefixes they hold (llm-d's KV-cache indexer, Dynamo, AIBrix)
subscribe to each engine and keep its set of cached blocks from three events:

    BlockStored(block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name)
    BlockRemoved(block_hashes, medium)          AllBlocksCleared()

The wire is vLLM's (`vllm/distributed/kv_events.py`, msgspec structs, `tag=True`,
`omit_defaults=True`): a batch is the msgpack array `[ts, [event, ...], data_parallel_rank]`;
an event is the array `[tag, *fields]`, e.g. `["BlockRemoved", [h1, h2], "GPU"]`, as vLLM sent
it until its structs dropped `array_like=True` (vllm-project/vllm#42892, mid-2026), or with
`"event_format": "map"` the map `{"type": tag, field: value, ...}` newer vLLM sends (llm-d's
indexer reads both; older AIBrix, Dynamo and kthena subscribers read only arrays). The PUB
socket sends each batch as three frames `(topic, seq, payload)`, `seq` an 8-byte big-endian
counter from 0; the optional ROUTER replay socket answers a request whose last frame is a start
`seq` with `(seq, payload)` for every batch it still keeps from there on, then `(-1, b"")`.
Engine N tags its batches `data_parallel_rank=N` and, like vLLM, adds N to the endpoints'
ports (ipc:// and inproc:// get `_dpN`).

Where the PUB socket listens: a loopback host (the default, `tcp://127.0.0.1:5557`) or a path
binds, and so does a wildcard (`tcp://*:5557`, every interface), with a warning, since the events
are unauthenticated and carry every cached prompt's token ids; any other host is a collector the
socket connects to (vLLM's rule, which binds only `*`, `::` and paths).

Block hashes an indexer can recompute from token ids (engine_proc/block_hash.py):
`digest_0 = sha256(sha256(b"zeroserve-prefix-cache-v1") + int64_le(tokens of block 0))`,
`digest_i = sha256(digest_{i-1} + int64_le(tokens of block i))`, and the hash on the wire is
the last 8 bytes of the digest as a big-endian unsigned integer (vLLM's integer form). The
first block of a request has `parent_block_hash` None, as in vLLM. "GPU" is vLLM's name for
the engine's own cache tier, kept on the CPU too so routers weigh it as the primary tier.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, NamedTuple

import ormsgpack
import zmq

from proto.engine_config import KVEventsConfig, offset_endpoint

logger = logging.getLogger(__name__)

MEDIUM = "GPU"
END_SEQ = (-1).to_bytes(8, "big", signed=True)
_POLL_S = 0.05
_CLOSE_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class BlockStored:
    """Consecutive full blocks of one request entered the prefix cache."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int

    def fields(self) -> list[tuple[str, Any]]:
        # NOTE: lora_id, medium and lora_name have no default in vLLM's struct, so they are always sent.
        return [
            ("block_hashes", self.block_hashes), ("parent_block_hash", self.parent_block_hash),
            ("token_ids", self.token_ids), ("block_size", self.block_size), ("lora_id", None), ("medium", MEDIUM),
            ("lora_name", None),
        ]


@dataclass(frozen=True)
class BlockRemoved:
    """Cached blocks were evicted (handed out for new tokens)."""

    block_hashes: list[int]

    def fields(self) -> list[tuple[str, Any]]:
        return [("block_hashes", self.block_hashes), ("medium", MEDIUM)]


@dataclass(frozen=True)
class AllBlocksCleared:
    """The prefix cache was reset: no block is cached any more."""

    def fields(self) -> list[tuple[str, Any]]:
        return []


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


def encode_batch(events: list[KVCacheEvent], timestamp: float, data_parallel_rank: int, event_format: str) -> bytes:
    """One batch as vLLM's `KVEventBatch` is laid out in msgpack, its events as arrays or maps."""
    if event_format == "map":
        wire: list[Any] = [{"type": type(event).__name__, **dict(event.fields())} for event in events]
    else:
        wire = [[type(event).__name__, *(value for _, value in event.fields())] for event in events]
    return ormsgpack.packb([timestamp, wire, data_parallel_rank])


class _Batch(NamedTuple):
    """A step's events waiting for the publisher thread."""

    seq: int
    events: list[KVCacheEvent]
    timestamp: float
    data_parallel_rank: int


_WILDCARD_HOSTS = ("*", "0.0.0.0", "[::]", "::")
_LOOPBACK_HOSTS = ("localhost", "[::1]", "::1")


def _host(endpoint: str) -> str | None:
    """The host of a tcp:// endpoint; None for a local path (ipc://, inproc://)."""
    if not endpoint.startswith("tcp://"):
        return None
    return endpoint.removeprefix("tcp://").rpartition(":")[0]


def is_wildcard(endpoint: str) -> bool:
    """Binds every interface: whoever reaches this machine may subscribe."""
    return _host(endpoint) in _WILDCARD_HOSTS


def binds(endpoint: str) -> bool:
    """A local path, a loopback or a wildcard host binds (listens for subscribers); another host is a
    collector to connect to (vLLM's rule, which binds only `*`, `::` and paths)."""
    host = _host(endpoint)
    return host is None or host in _WILDCARD_HOSTS + _LOOPBACK_HOSTS or host.startswith("127.")


class KVEventPublisher:
    """Publishes KV event batches from a thread of its own, keeping the last ones for replay."""

    def __init__(self, config: KVEventsConfig, engine_index: int) -> None:
        self.endpoint = offset_endpoint(config.endpoint, max(engine_index, 0))
        self.replay_endpoint = (
            None if config.replay_endpoint is None else offset_endpoint(config.replay_endpoint, max(engine_index, 0))
        )
        self._topic = config.topic.encode()
        self._event_format = config.event_format
        self._queue: queue.Queue[_Batch | None] = queue.Queue(maxsize=config.max_queue_size)
        self._replay_buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self.num_batches = 0
        self._ctx: zmq.Context[Any] = zmq.Context()
        # NOTE: bound here so a taken port fails the engine's start; only the thread uses them after.
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.hwm)
        self._replay: zmq.Socket[Any] | None = None
        try:
            (self._pub.bind if binds(self.endpoint) else self._pub.connect)(self.endpoint)
            if self.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(self.replay_endpoint)
        except zmq.ZMQError as exc:
            self._ctx.destroy(linger=0)
            raise ValueError(f"--kv-events-config: cannot open {self.endpoint} / {self.replay_endpoint}: {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="kv-events-output", daemon=True)
        self._thread.start()
        self._log_where()

    def _log_where(self) -> None:
        """Says whether subscribers connect here or the events go to a collector, warning of a wildcard bind."""
        if binds(self.endpoint):
            where = f"listening for subscribers on {self.endpoint}"
        else:
            where = f"connecting to a collector at {self.endpoint} (a named host is connected to, as in vLLM)"
        replay = "" if self.replay_endpoint is None else f", replay requests on {self.replay_endpoint}"
        if any(is_wildcard(endpoint or "") for endpoint in (self.endpoint, self.replay_endpoint)):
            logger.warning(
                "KV cache events: %s%s: every interface, unauthenticated; whoever reaches the port reads the token "
                "ids of every cached prompt", where, replay,
            )
        else:
            logger.info("KV cache events: %s%s", where, replay)

    def publish(self, events: list[KVCacheEvent], data_parallel_rank: int) -> None:
        """Hands a batch to the thread; never blocks the busy loop (a full queue drops it, leaving a gap in seq)."""
        seq, self.num_batches = self.num_batches, self.num_batches + 1
        try:
            self._queue.put_nowait(_Batch(seq, events, time.time(), data_parallel_rank))
        except queue.Full:
            logger.error("KV events batch %d dropped: %d batches wait to be sent", seq, self._queue.qsize())

    def close(self) -> None:
        """Sends what is queued, then closes the sockets."""
        try:
            self._queue.put(None, timeout=_CLOSE_TIMEOUT_S)
        except queue.Full:
            logger.warning("KV events: %d batches still queued at close are not sent", self._queue.qsize())
        self._thread.join(_CLOSE_TIMEOUT_S)
        self._ctx.destroy(linger=int(_CLOSE_TIMEOUT_S * 1000))

    def _run(self) -> None:
        is_running = True
        while is_running:
            try:
                is_running = self._send(self._queue.get(timeout=_POLL_S))
            except queue.Empty:
                pass
            if self._replay is not None and self._replay.poll(0):
                # NOTE: first the batches published before the request came, so the replay has them.
                while is_running and not self._queue.empty():
                    is_running = self._send(self._queue.get_nowait())
                self._answer_replay()

    def _send(self, batch: _Batch | None) -> bool:
        """Encodes and publishes one batch and keeps it for replay; False at the end of the queue (close)."""
        if batch is None:
            return False
        seq = batch.seq
        payload = encode_batch(batch.events, batch.timestamp, batch.data_parallel_rank, self._event_format)
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._replay_buffer.append((seq, payload))
        return True

    def _answer_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        # NOTE: [identity, b"", start seq] from a REQ socket (vLLM's), [identity, start seq] from a DEALER.
        identity, envelope, start_bytes = frames[0], frames[1:-1], frames[-1]
        if len(start_bytes) != 8:
            logger.warning("ignoring a KV events replay request without an 8-byte start seq")
            return
        start_seq = int.from_bytes(start_bytes, "big")
        for seq, payload in self._replay_buffer:
            if seq >= start_seq:
                self._replay.send_multipart((identity, *envelope, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((identity, *envelope, END_SEQ, b""))
