"""One tiny-model server for the HTTP tests of this folder (starting one costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.server_process import ServerProcess, running_server


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with running_server(tiny_model_dir, "--served-model-name", "tiny", "tiny-alias") as server:
        yield server


@pytest.fixture
def sdk(tiny_server: ServerProcess) -> openai.OpenAI:
    """The official OpenAI client, pointed at the tiny-model server."""
    return openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
