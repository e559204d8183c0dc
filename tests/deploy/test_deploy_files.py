"""The deploy files load, and every zeroserve command line in them is one the real CLI accepts."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli.main import build_parser, config_from_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def check_command(argv: list[str]) -> None:
    """Parses as `zeroserve` would; a serve command must also make a valid config."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"zeroserve rejects {argv}") from exc
    if args.command == "serve":
        config_from_args(args)


def compose_commands() -> list[list[str]]:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return [service["command"] for service in compose["services"].values()]


def k8s_documents() -> list[dict[str, Any]]:
    return [doc for path in sorted((DEPLOY / "k8s").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text())]


def k8s_commands() -> list[list[str]]:
    commands = []
    for doc in k8s_documents():
        if doc["kind"] == "Deployment":
            commands += [container["args"] for container in doc["spec"]["template"]["spec"]["containers"]]
    return commands


def dockerfile_command() -> list[str]:
    cmd = re.search(r"^CMD (\[.*\])$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    assert cmd is not None
    command: list[str] = json.loads(cmd.group(1))
    return command


@pytest.mark.parametrize("argv", [*compose_commands(), *k8s_commands(), dockerfile_command()], ids=" ".join)
def test_every_command_line_parses(argv: list[str]) -> None:
    check_command(argv)


def test_compose_runs_a_gateway_and_two_engines_with_curve_secrets() -> None:
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    commands = {name: service["command"][0] for name, service in compose["services"].items()}
    assert sorted(commands.values()) == ["engine", "engine", "serve"]
    for service in compose["services"].values():
        assert service["secrets"], "every link end needs its key"
        for secret in service["secrets"]:
            assert secret in compose["secrets"]


def test_k8s_gateway_has_probes_on_health_and_engines_scale() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_documents()}
    gateway = docs["Deployment", "zeroserve-gateway"]["spec"]["template"]["spec"]["containers"][0]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["resources"]["requests"]
    service_ports = {p["port"] for p in docs["Service", "zeroserve-gateway"]["spec"]["ports"]}
    assert service_ports == {8000, 5555, 5556}
    engines = docs["Deployment", "zeroserve-engine"]
    assert engines["spec"]["replicas"] >= 2
    assert engines["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]


def test_a_renamed_flag_would_fail() -> None:
    with pytest.raises(AssertionError, match="rejects"):
        check_command(["serve", "--engine-adress=tcp://0.0.0.0:5555"])
