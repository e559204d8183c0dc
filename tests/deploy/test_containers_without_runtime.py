"""The image's and the compose file's commands, run as the containers would run them but as plain
processes (no container runtime here or in CI): keys made as deploy/README.md says, the compose
gateway and its two engines started with their own command lines (paths, hosts and ports mapped
to this machine, the tiny model appended), the engines joining over CURVE, and the image's
HEALTHCHECK passing once they have."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.server_process import free_engine_port, free_port

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
REPO = DEPLOY.parent
SIZES = ["--num-threads", "1", "--kv-cache-memory", "0.05", "--max-model-len", "1024"]
JOIN_TIMEOUT_S = 300.0


def dockerfile() -> str:
    return (DEPLOY / "Dockerfile").read_text()


def dockerfile_json(instruction: str) -> list[str]:
    match = re.search(rf"^{instruction} (\[.*\])$", dockerfile(), re.MULTILINE)
    assert match is not None, f"the Dockerfile has no {instruction} in exec form"
    words: list[str] = json.loads(match.group(1))
    return words


def healthcheck_command() -> list[str]:
    match = re.search(r"^HEALTHCHECK .*\n\s+CMD (\[.*\])$", dockerfile(), re.MULTILINE)
    assert match is not None
    words: list[str] = json.loads(match.group(1))
    return words


def test_the_image_copies_what_exists_and_installs_as_the_makefile_does() -> None:
    for sources in re.findall(r"^COPY (.+) \S+$", dockerfile(), re.MULTILINE):
        for source in sources.split():
            assert (REPO / source).exists(), f"the Dockerfile copies {source}, which the repository lacks"
    makefile = (REPO / "Makefile").read_text()
    assert "\ninstall:" in makefile and "make install" in dockerfile()
    torch_version = re.search(r"^TORCH_VERSION := (\S+)$", makefile, re.MULTILINE)
    assert torch_version is not None and f"torch=={torch_version.group(1)}" in dockerfile()
    assert re.search(r"^FROM \S+:\S+$", dockerfile(), re.MULTILINE), "the base image is pinned to a tag"
    assert dockerfile_json("ENTRYPOINT") == [".venv/bin/zeroserve"]


class Mapping:
    """Container paths, host names and ports in a command line, as they are on this machine."""

    def __init__(self, compose: dict[str, Any], keys: Path, http_port: int, engine_port: int) -> None:
        self.paths = {f"/run/secrets/{name}": str(keys.parent / spec["file"]) for name, spec in compose["secrets"].items()}
        for service in compose["services"].values():
            for volume in service.get("volumes", []):
                source, target = volume.split(":")[:2]
                self.paths[target] = str(keys.parent / source)
        self.hosts = {f"{name}:": "127.0.0.1:" for name in compose["services"]}
        self.ports = {":8000": f":{http_port}", "=8000": f"={http_port}", ":5555": f":{engine_port}"}

    def __call__(self, arg: str) -> str:
        for table in (self.paths, self.hosts, self.ports):
            for before, after in table.items():
                arg = arg.replace(before, after)
        return arg


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """deploy/keys as deploy/README.md makes it (here outside the work tree)."""
    keys = tmp_path / "deploy" / "keys"
    (keys / "authorized").mkdir(parents=True)
    for name in ("gateway", "engine-1", "engine-2"):
        subprocess.run([sys.executable, "-m", "service", "keys", "generate", "--dir", str(keys), "--name", name],
                       check=True, capture_output=True)
    for public in keys.glob("engine-*.key"):
        shutil.copy(public, keys / "authorized")
    return keys


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
    for proc in started:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_the_compose_services_join_over_curve_and_pass_the_image_healthcheck(
    keys: Path, processes: list[subprocess.Popen[bytes]], tiny_model_dir: Path, tmp_path: Path
) -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    http_port = free_port()
    mapped = Mapping(compose, keys, http_port, free_engine_port())
    gateway_log = tmp_path / "gateway.log"
    # NOTE: the gateway first, as depends_on orders it; its log says when each engine joined.
    for name, service in sorted(compose["services"].items(), key=lambda item: item[0] != "gateway"):
        command, *args = [mapped(arg) for arg in service["command"]]
        log = gateway_log if name == "gateway" else tmp_path / f"{name}.log"
        with log.open("wb") as out:
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "service", command, str(tiny_model_dir), *args, *SIZES],
                env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=out, stderr=subprocess.STDOUT,
            ))
    healthcheck = [sys.executable if word == ".venv/bin/python" else mapped(word) for word in healthcheck_command()]
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while gateway_log.read_text().count(" joined from ") < 2 or subprocess.run(healthcheck, capture_output=True).returncode != 0:
        assert all(proc.poll() is None for proc in processes), gateway_log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the engines did not join and pass the healthcheck in time"
        time.sleep(0.5)
