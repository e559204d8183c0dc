"""The engine's ready message: what it learned at start-up, and the protocol it speaks."""

from __future__ import annotations

from dataclasses import dataclass, field

PROTOCOL_VERSION = 1


@dataclass(slots=True)
class EngineReady:
    """First message an engine sends on its DEALER; registers its identity with the ROUTER."""

    engine_index: int
    protocol_version: int = PROTOCOL_VERSION
    model_name: str = ""
    max_model_len: int = 0
    num_kv_blocks: int = 0
    block_size: int = 0
    vocab_size: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
