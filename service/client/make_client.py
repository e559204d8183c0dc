"""`make_client`: picks which of the three clients reaches the engine."""

from __future__ import annotations

from proto.engine_config import EngineConfig
from service.client.async_mp_client import AsyncMPClient
from service.client.core_client import EngineCoreClient
from service.client.inproc_client import InprocClient
from service.client.sync_mp_client import SyncMPClient


def make_client(engine_config: EngineConfig, multiprocess_mode: bool, asyncio_mode: bool) -> EngineCoreClient:
    """A started client; an asyncio one must still be awaited with `wait_ready()`."""
    if asyncio_mode:
        if not multiprocess_mode:
            raise ValueError("an asyncio client runs its engine in another process")
        return AsyncMPClient(engine_config)
    if multiprocess_mode:
        return SyncMPClient(engine_config)
    return InprocClient(engine_config)
