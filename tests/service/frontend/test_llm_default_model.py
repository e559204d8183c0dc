"""LLM on the real default model: built from its name, and asleep/awake without losing anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from service import LLM, SamplingParams
from service.client.sync_mp_client import SyncMPClient
from service.model_files.model_registry import DEFAULT_MODEL

pytestmark = pytest.mark.real_model


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_sleep_frees_memory_and_wake_up_restores_generation(default_model_path: Path) -> None:
    with LLM(DEFAULT_MODEL, kv_cache_memory_gib=0.25, max_model_len=2048, num_threads=2) as llm:
        client = llm.llm_engine.engine_core
        assert isinstance(client, SyncMPClient)
        params = SamplingParams(temperature=0.0, max_tokens=16)
        conversation = [{"role": "user", "content": "What is the capital of Japan?"}]
        [before] = llm.chat(conversation, params, use_tqdm=False)
        assert "Tokyo" in before.outputs[0].text
        awake = rss_mib(client.engine_pid)
        llm.sleep(level=2)
        asleep = rss_mib(client.engine_pid)
        # NOTE: the weights are kept as the kernels' packings of the file's blocks (int4_q8 projections, an
        # int8_q8 head: ~95 MiB; the embedding is read from the file), the KV cache's pages taken as used.
        assert asleep < awake - 80, (awake, asleep)
        with pytest.raises(RuntimeError, match="asleep"):
            llm.chat(conversation, params, use_tqdm=False)
        llm.wake_up()
        assert rss_mib(client.engine_pid) > asleep + 80
        [after] = llm.chat(conversation, params, use_tqdm=False)
        assert after.outputs[0].token_ids == before.outputs[0].token_ids
