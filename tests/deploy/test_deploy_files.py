"""The deploy files load, and every zeroserve command line in them is one the real CLI accepts."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.cli.main import build_parser, config_from_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# NOTE: /health waits for an engine step, seconds on a busy CPU; Kubernetes' defaults (1 s, 3) fail a busy server.
MIN_PROBE_TIMEOUT_S = 5
MIN_PROBE_FAILURES = 3


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
    paths = sorted(p for p in (DEPLOY / "k8s").rglob("*.yaml") if p.name != "kustomization.yaml")
    return [doc for path in paths for doc in yaml.safe_load_all(path.read_text())]


def k8s_commands() -> list[list[str]]:
    commands = []
    for doc in k8s_documents():
        if doc["kind"] == "Deployment":
            containers = doc["spec"]["template"]["spec"]["containers"]
            commands += [c["args"] for c in containers if c["image"].startswith("zeroserve:")]
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


def test_k8s_http_servers_are_live_on_livez_and_ready_on_health() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_documents()}
    for name in ("zeroserve-gateway", "zeroserve-pool"):
        server = docs["Deployment", name]["spec"]["template"]["spec"]["containers"][0]
        assert server["livenessProbe"]["httpGet"]["path"] == "/livez"
        assert server["startupProbe"]["httpGet"]["path"] == "/livez"
        assert server["readinessProbe"]["httpGet"]["path"] == "/health"
        assert server["resources"]["requests"]


def test_k8s_engines_reach_a_gateway_that_is_not_ready_yet() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_documents()}
    assert {p["port"] for p in docs["Service", "zeroserve-gateway"]["spec"]["ports"]} == {8000}
    link = docs["Service", "zeroserve-engine-link"]["spec"]
    assert link["publishNotReadyAddresses"] is True
    assert {p["port"] for p in link["ports"]} == {5555, 5556}
    engine = docs["Deployment", "zeroserve-engine"]["spec"]["template"]["spec"]["containers"][0]
    assert "--gateway=tcp://zeroserve-engine-link:5555" in engine["args"]


def test_k8s_engines_and_pool_servers_scale_with_a_disruption_budget() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_documents()}
    for name in ("zeroserve-engine", "zeroserve-pool"):
        deployment = docs["Deployment", name]
        assert deployment["spec"]["replicas"] >= 2
        assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
        budget = docs["PodDisruptionBudget", name]["spec"]
        assert budget["selector"] == deployment["spec"]["selector"] and budget["maxUnavailable"] == 1


def test_a_renamed_flag_would_fail() -> None:
    with pytest.raises(AssertionError, match="rejects"):
        check_command(["serve", "--engine-adress=tcp://0.0.0.0:5555"])


def probes(node: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every Kubernetes probe (a `...Probe` key) and compose healthcheck under `node`, wherever it sits."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(key, str) and (key.endswith("Probe") or key == "healthcheck"):
                yield f"{where}: {key}", value
            else:
                yield from probes(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, item in enumerate(node):
            yield from probes(item, f"{where}[{index}]")


def deploy_probes() -> list[tuple[str, dict[str, Any]]]:
    """The probes of every YAML file under deploy/ (Kubernetes manifests and the compose file)."""
    paths = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
    return [
        probe for path in paths for index, doc in enumerate(yaml.safe_load_all(path.read_text()))
        for probe in probes(doc, f"{path.relative_to(DEPLOY)}#{index}")
    ]


def seconds(duration: str) -> float:
    """A compose or Dockerfile duration (`10s`, `1m30s`, `500ms`) in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(a + b for a, b in parts) == duration, f"not a duration: {duration!r}"
    return sum(float(amount) * units[unit] for amount, unit in parts)


def too_short(name: str, probe: dict[str, Any]) -> list[str]:
    """What `probe` lacks: a timeout of MIN_PROBE_TIMEOUT_S or more and MIN_PROBE_FAILURES failures or more."""
    if name.endswith("healthcheck"):
        if probe.get("disable") is True:
            return []
        timeout_s, failures = seconds(str(probe.get("timeout", "0s"))), probe.get("retries", 0)
    else:
        timeout_s, failures = probe.get("timeoutSeconds", 1), probe.get("failureThreshold", 3)
    return [
        *([f"{name} times out after {timeout_s:g} s"] if timeout_s < MIN_PROBE_TIMEOUT_S else []),
        *([f"{name} fails after {failures} failures"] if failures < MIN_PROBE_FAILURES else []),
    ]


def test_every_probe_waits_for_a_busy_engine_step() -> None:
    found = deploy_probes()
    names = " ".join(name for name, _ in found)
    for kind in ("startupProbe", "livenessProbe", "readinessProbe", "healthcheck"):
        assert kind in names, f"no {kind} found under deploy/: the walk misses them"
    assert [problem for name, probe in found for problem in too_short(name, probe)] == []


def test_the_images_healthcheck_waits_for_a_busy_engine_step() -> None:
    match = re.search(r"^HEALTHCHECK (.*) \\$", (DEPLOY / "Dockerfile").read_text(), re.MULTILINE)
    assert match is not None
    options = dict(re.findall(r"--([\w-]+)=(\S+)", match.group(1)))
    # NOTE: Docker's defaults: a 30 s timeout, 3 retries.
    assert seconds(options.get("timeout", "30s")) >= MIN_PROBE_TIMEOUT_S
    assert int(options.get("retries", "3")) >= MIN_PROBE_FAILURES


def test_a_probe_left_at_kubernetes_defaults_would_fail() -> None:
    assert too_short("readinessProbe", {"httpGet": {"path": "/health"}}) == ["readinessProbe times out after 1 s"]
    assert too_short("healthcheck", {"timeout": "3s", "retries": 2}) == [
        "healthcheck times out after 3 s", "healthcheck fails after 2 failures",
    ]
