"""How engines join a gateway: the ready message (repeated as a heartbeat), the gateway's
answer, and the engine's drain and goodbye.

Engine → gateway, on the engine's DEALER: `[EngineMessageType, *msgpack frames]`.
Gateway → engine, on the ROUTER: `[RequestType.HANDSHAKE, *EngineAccept]`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

PROTOCOL_VERSION = 2

# NOTE: an engine asks the gateway to give it an index (a headless engine on another host).
ANY_ENGINE_INDEX = -1


class EngineMessageType(bytes, enum.Enum):
    """First frame of every engine → gateway message on the DEALER."""

    READY = b"\x10"  # registers the engine; repeated every second as its heartbeat
    DRAINING = b"\x11"  # no new requests, please: the engine is leaving once idle
    GOODBYE = b"\x12"  # drained and gone


@dataclass(slots=True)
class EngineReady:
    """What an engine is and can hold: the gateway checks it against the others before use."""

    engine_index: int
    protocol_version: int = PROTOCOL_VERSION
    model_name: str = ""
    max_model_len: int = 0
    num_kv_blocks: int = 0
    block_size: int = 0
    vocab_size: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
    host: str = ""
    cpu: str = ""  # the CPU (or device) and what torch can run on it
    kernel_choices: dict[str, str] = field(default_factory=dict)  # what runs each piece of a step
    structured_output_backend: str = "xgrammar"  # the grammar library its constraints compile with
    # NOTE: one per engine process: a new process under a known identity is a replacement (the one
    # before it is gone with its requests), not that engine's heartbeat.
    instance_id: str = ""
    # NOTE: what the engine holds, so a gateway can keep several engines within a memory budget.
    device: str = "cpu"  # the torch device it runs on: "cpu", "cuda:0"
    # NOTE: the most the engine process holds, re-measured for each heartbeat: on the CPU its peak resident
    # memory, or if more, its runtime, weights and whole KV cache (the cache's pages are resident only once
    # written); on a GPU the CUDA caching allocator's peak reserved memory (the process's host memory and
    # CUDA's own context are not counted there).
    memory_bytes: int = 0
    weight_bytes: int = 0  # the model's parameters and buffers as loaded
    kv_cache_bytes: int = 0  # the KV cache's tensors
    runtime_bytes: int = 0  # resident before the model loaded: the interpreter, torch, the kernels (0 on a GPU)
    # NOTE: "generate" (tokens) or "pooling" (an encoder: embeddings and scores, no tokens), as vLLM's --runner.
    runner: str = "generate"
    pooling_tasks: list[str] = field(default_factory=list)  # a pooling engine's: "embed", and "score" with a classifier

    @property
    def num_kv_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size


@dataclass(slots=True)
class EngineAccept:
    """The gateway's answer to a ready message: the engine's index, or why it is refused."""

    engine_index: int
    error: str | None = None
