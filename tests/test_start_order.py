"""The start-up order of deploy/k8s/'s pods, as separate processes with the manifests' own command
lines (key mounts, the engine-link Service and ports mapped to this machine, the tiny model
appended): an engine pod that starts before its gateway waits for it and joins it over CURVE, and
joins again after the gateway restarts, while the gateway's /livez (liveness) stays 200 and its
/health (readiness) turns 200 once the engine serves."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.server_process import ServerProcess, free_engine_port, running_server, wait_healthy

K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
SIZES = ["--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "1024"]


def pod_args(path: str, name: str) -> list[str]:
    """The first container's args of Deployment `name` in deploy/k8s/`path`."""
    for doc in yaml.safe_load_all((K8S / path).read_text()):
        if (doc["kind"], doc["metadata"]["name"]) == ("Deployment", name):
            args: list[str] = doc["spec"]["template"]["spec"]["containers"][0]["args"]
            return args
    raise AssertionError(f"no Deployment {name} in {path}")


@pytest.fixture
def mapped(tmp_path: Path) -> dict[str, str]:
    """Each pod's mounted key files (deploy/README.md's secrets) and addresses, as on this machine."""
    keys = tmp_path / "keys"
    (keys / "authorized").mkdir(parents=True)
    for name in ("gateway", "engine"):
        subprocess.run([sys.executable, "-m", "service", "keys", "generate", "--dir", str(keys), "--name", name],
                       check=True, capture_output=True)
    shutil.copy(keys / "engine.key", keys / "authorized")
    engine_port = free_engine_port()
    return {
        "/keys/gateway/gateway.key_secret": str(keys / "gateway.key_secret"),
        "/keys/engine/engine.key_secret": str(keys / "engine.key_secret"),
        "/keys/engine/gateway.key": str(keys / "gateway.key"),
        "/keys/authorized": str(keys / "authorized"),
        "zeroserve-engine-link:5555": f"127.0.0.1:{engine_port}",
        "0.0.0.0:5555": f"127.0.0.1:{engine_port}",
    }


def mapped_args(args: list[str], mapped: dict[str, str]) -> list[str]:
    for before, after in mapped.items():
        args = [arg.replace(before, after) for arg in args]
    # NOTE: the test harness picks the HTTP port.
    return [arg for arg in args if not arg.startswith("--port=")]


@pytest.fixture
def engine(tiny_model_dir: Path, mapped: dict[str, str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """An engine pod, started first: it waits for the gateway as long as its --accept-timeout says."""
    command, *args = mapped_args(pod_args("engines.yaml", "zeroserve-engine"), mapped)
    with (tmp_path / "engine.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "service", command, str(tiny_model_dir), *args, *SIZES],
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def serves(gateway: ServerProcess) -> None:
    """/health turns 200, and a completion through the gateway comes back."""
    await wait_healthy(gateway)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=60) as client:
        response = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 4})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"]


def test_an_engine_started_first_joins_the_gateway_started_later_and_again_after_its_restart(
    tiny_model_dir: Path, mapped: dict[str, str], engine: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    command, *gateway_args = mapped_args(pod_args("gateway.yaml", "zeroserve-gateway"), mapped)
    assert command == "serve"
    for start in ("first", "restarted"):
        log = tmp_path / f"gateway-{start}.log"
        with running_server(tiny_model_dir, *gateway_args, *SIZES, log_file=log, wait_healthy=False) as gateway:
            # NOTE: the liveness probe's route answers from the first moment, engine or not.
            assert httpx.get(f"{gateway.base_url}/livez", timeout=10).status_code == 200
            asyncio.run(serves(gateway))
            assert httpx.get(f"{gateway.base_url}/livez", timeout=10).status_code == 200
        assert gateway.proc.returncode is not None
        assert " joined from " in log.read_text(), f"the engine never joined the {start} gateway"
        assert engine.poll() is None, "the engine must outlive its gateway"
