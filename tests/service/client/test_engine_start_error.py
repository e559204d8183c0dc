"""An engine that cannot load its model says why, and the gateway's client passes the reason on
(a multi-model server lists it as the model's failure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto.engine_config import EngineConfig
from service.client.async_mp_client import AsyncMPClient
from service.client.core_client import EngineDeadError


async def test_an_engine_whose_file_is_cut_short_fails_its_start_with_the_reason(
    default_model_path: Path, tmp_path: Path
) -> None:
    # NOTE: the header and tensor list are whole, the data is not: the engine's load refuses it, and its start
    # error carries why.
    truncated = tmp_path / "truncated.gguf"
    with default_model_path.open("rb") as source:
        truncated.write_bytes(source.read(3_000_000))
    config = EngineConfig(model_path=str(truncated), model_name="truncated", kv_cache_memory_gib=0.05, num_threads=1)
    client = AsyncMPClient(config)
    try:
        with pytest.raises(EngineDeadError) as failure:
            await client.wait_ready(timeout=120)
    finally:
        client.shutdown()
    message = str(failure.value)
    assert "did not start" not in message
    assert "truncated.gguf is cut short" in message
