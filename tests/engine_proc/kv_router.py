"""A router's side of KV cache events: its bookkeeping of an engine's cached blocks, and a replay request."""

from __future__ import annotations

from typing import Any

import zmq

RECV_TIMEOUT_MS = 10_000


def apply_batch(cached: set[int], batch: list[Any]) -> None:
    """A router's bookkeeping, strict: a block is stored only when absent and removed only when present."""
    _, events, _ = batch
    for tag, *fields in events:
        if tag == "BlockStored":
            block_hashes, _parent, token_ids, block_size, lora_id, medium, lora_name = fields
            assert len(token_ids) == len(block_hashes) * block_size and medium == "GPU"
            assert lora_id is None and lora_name is None
            assert not cached & set(block_hashes), "a block stored twice"
            cached.update(block_hashes)
        elif tag == "BlockRemoved":
            block_hashes, medium = fields
            assert set(block_hashes) <= cached, "a block removed that was never stored"
            cached.difference_update(block_hashes)
        else:
            assert (tag, fields) == ("AllBlocksCleared", [])
            cached.clear()


def replay(ctx: zmq.Context[Any], endpoint: str, start_seq: int) -> dict[int, bytes]:
    """The batches from `start_seq` on that the publisher still keeps, asked for as vLLM's subscriber does."""
    socket = ctx.socket(zmq.DEALER)
    socket.connect(endpoint)
    socket.send_multipart((b"", start_seq.to_bytes(8, "big")))
    batches = {}
    while True:
        assert socket.poll(RECV_TIMEOUT_MS), "no answer from the replay socket"
        _, seq_bytes, payload = socket.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        if seq == -1:
            break
        batches[seq] = payload
    socket.close(linger=0)
    return batches
