"""Engines on other hosts: a gateway and its engines in two network namespaces joined by a veth
pair (two hosts with their own addresses), CURVE-secured links, engines joining mid-run, and an
engine with an unauthorised key refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service import LLM, SamplingParams
from tests.service.load_client import prompts

GATEWAY_IP, ENGINES_IP = "10.231.0.1", "10.231.0.2"
HTTP_PORT, ENGINE_PORT = 8000, 5555
ENGINE_FLAGS = ["--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "1024"]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2 for network namespaces"
)


@dataclass
class Hosts:
    """Two network namespaces: the gateway's and the engines'."""

    gateway: str
    engines: str

    def run(self, namespace: str, *command: str, **kwargs: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["ip", "netns", "exec", namespace, *command], text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"}, **kwargs,  # type: ignore[call-overload]
        )


def sh(*command: str) -> None:
    subprocess.run(command, check=True)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    suffix = str(os.getpid())[-5:]
    gateway, engines = f"zsgw{suffix}", f"zsen{suffix}"
    veth_gateway, veth_engines = f"zsg{suffix}", f"zse{suffix}"
    sh("ip", "netns", "add", gateway)
    sh("ip", "netns", "add", engines)
    try:
        sh("ip", "link", "add", veth_gateway, "type", "veth", "peer", "name", veth_engines)
        sh("ip", "link", "set", veth_gateway, "netns", gateway)
        sh("ip", "link", "set", veth_engines, "netns", engines)
        for namespace, veth, ip in ((gateway, veth_gateway, GATEWAY_IP), (engines, veth_engines, ENGINES_IP)):
            sh("ip", "-n", namespace, "addr", "add", f"{ip}/24", "dev", veth)
            sh("ip", "-n", namespace, "link", "set", veth, "up")
            sh("ip", "-n", namespace, "link", "set", "lo", "up")
        yield Hosts(gateway, engines)
    finally:
        sh("ip", "netns", "del", gateway)
        sh("ip", "netns", "del", engines)


def load(hosts: Hosts, num: int, max_tokens: int, tag: str) -> dict[str, object]:
    """Runs the load client on the gateway's host (where its HTTP address is)."""
    proc = hosts.run(
        hosts.gateway, sys.executable, "-m", "tests.service.load_client", f"http://{GATEWAY_IP}:{HTTP_PORT}",
        str(num), str(max_tokens), tag, stdout=subprocess.PIPE,
    )
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    result: dict[str, object] = json.loads(out)
    return result


def wait_for(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_engines_on_another_host_serve_join_and_unauthorised_keys_are_refused(
    hosts: Hosts, tiny_model_dir: Path, tmp_path: Path
) -> None:
    keys, authorized = tmp_path / "keys", tmp_path / "authorized"
    for name in ("gateway", "engine-a", "engine-b", "engine-c", "rogue"):
        sh(sys.executable, "-m", "service", "keys", "generate", "--dir", str(keys), "--name", name)
    authorized.mkdir()
    for name in ("engine-a", "engine-b", "engine-c"):
        shutil.copy(keys / f"{name}.key", authorized)
    gateway_log = tmp_path / "gateway.log"
    model = str(tiny_model_dir)
    processes: list[subprocess.Popen[str]] = []

    def start_engine(name: str, *args: str, **kwargs: object) -> subprocess.Popen[str]:
        proc = hosts.run(
            hosts.engines, sys.executable, "-m", "service", "engine", model,
            "--gateway", f"tcp://{GATEWAY_IP}:{ENGINE_PORT}", "--curve-secret-key", str(keys / f"{name}.key_secret"),
            "--gateway-public-key", str(keys / "gateway.key"), *ENGINE_FLAGS, *args, **kwargs,
        )
        processes.append(proc)
        return proc

    def joined() -> int:
        return gateway_log.read_text().count(" joined from ")

    try:
        with gateway_log.open("w") as log:
            processes.append(hosts.run(
                hosts.gateway, sys.executable, "-m", "service", "serve", model, "--host", GATEWAY_IP,
                "--port", str(HTTP_PORT), "--data-parallel-size", "0",
                "--engine-address", f"tcp://{GATEWAY_IP}:{ENGINE_PORT}", "--curve-secret-key",
                str(keys / "gateway.key_secret"), "--curve-authorized-keys", str(authorized), *ENGINE_FLAGS,
                stdout=log, stderr=subprocess.STDOUT,
            ))
        start_engine("engine-a")
        start_engine("engine-b")
        wait_for(lambda: joined() == 2, 120, "two engines to join")

        first = load(hosts, 40, 8, "first")
        expected = reference_texts(tiny_model_dir, prompts(40, "first"), 8)
        results = first["results"]
        assert isinstance(results, list)
        assert [r["status"] for r in results] == [200] * 40
        assert [r["text"] for r in results] == expected
        served = first["served"]
        assert isinstance(served, dict) and sum(served.values()) == 40
        assert all(served.get(engine, 0) > 0 for engine in ("0", "1")), served

        start_engine("engine-c")
        wait_for(lambda: joined() == 3, 120, "a third engine to join")
        second = load(hosts, 40, 8, "second")
        served = second["served"]
        assert isinstance(served, dict) and served.get("2", 0) > 0, served

        rogue = start_engine("rogue", "--accept-timeout", "2", stderr=subprocess.PIPE)
        _, rogue_log = rogue.communicate(timeout=120)
        assert rogue.returncode == 1 and "did not accept this engine" in rogue_log
        assert joined() == 3
    finally:
        for proc in processes:
            if proc.poll() is None:
                proc.terminate()
        for proc in processes:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


def reference_texts(model_dir: Path, texts: list[str], max_tokens: int) -> list[str]:
    with LLM(str(model_dir), kv_cache_memory_gib=0.05, max_model_len=1024, num_threads=1, multiprocess_mode=False,
             stats_log_interval_s=0) as llm:
        outputs = llm.generate(texts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
                               use_tqdm=False)
    return [o.outputs[0].text for o in outputs]
