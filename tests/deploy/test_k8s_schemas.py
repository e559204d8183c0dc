"""Every Kubernetes manifest in deploy/k8s/ validates offline against pinned schemas (Kubernetes'
own kinds, the Gateway API's HTTPRoute, the inference extension's InferencePool and endpoint picker
config), strictly: an unknown or misspelled field fails as `kubectl apply` would refuse it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
# NOTE: the oldest Kubernetes these manifests are for; kubernetes-validate ships its schemas.
KUBERNETES_VERSION = "1.31"
CUSTOM_KINDS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): "inferencepool-inference.networking.k8s.io-v1.json",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "httproute-gateway.networking.k8s.io-v1.json",
}
EPP_CONFIG_SCHEMA = "endpointpickerconfig-inference.networking.x-k8s.io-v1alpha1.json"


def manifest_paths() -> list[Path]:
    return sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def all_documents() -> list[dict[str, Any]]:
    return [doc for path in manifest_paths() for doc in documents(path)]


def closed(schema: Any) -> Any:
    """A CRD schema with unknown fields refused (the API server's strict field validation) where it
    lists its fields and does not keep unknown ones."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    schema = {key: closed(value) for key, value in schema.items()}
    if (
        "properties" in schema and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema["additionalProperties"] = False
    return schema


def custom_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / name).read_text())
    return closed(schema) if name in CUSTOM_KINDS.values() else schema


def validate(doc: dict[str, Any]) -> None:
    schema_name = CUSTOM_KINDS.get((doc["apiVersion"], doc["kind"]))
    if schema_name is None:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        return
    metadata = doc["metadata"]
    assert set(metadata) <= {"name", "labels", "annotations", "namespace"} and metadata["name"]
    jsonschema.Draft7Validator(custom_schema(schema_name)).validate({**doc, "metadata": {}})


@pytest.mark.parametrize(
    "doc", all_documents(), ids=lambda doc: f"{doc['kind']}/{doc['metadata']['name']}",
)
def test_every_manifest_validates_against_the_pinned_schemas(doc: dict[str, Any]) -> None:
    validate(doc)


def test_a_misspelled_field_fails_validation() -> None:
    pool = next(doc for doc in all_documents() if doc["kind"] == "InferencePool")
    with pytest.raises(jsonschema.ValidationError, match="targetPort"):
        validate({**pool, "spec": {**pool["spec"], "targetPort": 8000}})
    deployment = next(doc for doc in all_documents() if doc["kind"] == "Deployment")
    with pytest.raises(kubernetes_validate.ValidationError):
        validate({**deployment, "spec": {**deployment["spec"], "replica": 2}})


@pytest.mark.parametrize("folder", [K8S, K8S / "inference-pool"], ids=lambda p: p.name)
def test_each_kustomization_lists_exactly_its_folders_manifests(folder: Path) -> None:
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert (kustomization["apiVersion"], kustomization["kind"]) == ("kustomize.config.k8s.io/v1beta1", "Kustomization")
    listed = kustomization["resources"]
    assert sorted(listed) == sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
    assert len(set(listed)) == len(listed)


def test_the_endpoint_picker_config_is_one_the_picker_reads() -> None:
    [config_map] = [d for d in all_documents() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-epp")]
    config = yaml.safe_load(config_map["data"]["default-plugins.yaml"])
    jsonschema.Draft7Validator(custom_schema(EPP_CONFIG_SCHEMA)).validate(config)
    declared = {plugin.get("name", plugin["type"]) for plugin in config["plugins"]}
    used = {ref["pluginRef"] for profile in config["schedulingProfiles"] for ref in profile["plugins"]}
    assert used <= declared


def test_the_pool_its_route_and_its_picker_name_each_other() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in all_documents()}
    pool = docs["InferencePool", "zeroserve-pool"]
    servers = docs["Deployment", "zeroserve-pool"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= servers["spec"]["template"]["metadata"]["labels"].items()
    ports = {p["containerPort"] for c in servers["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
    assert {p["number"] for p in pool["spec"]["targetPorts"]} <= ports
    picker = pool["spec"]["endpointPickerRef"]
    assert picker["port"]["number"] in {p["port"] for p in docs["Service", picker["name"]]["spec"]["ports"]}
    [backend] = [b for rule in docs["HTTPRoute", "zeroserve"]["spec"]["rules"] for b in rule["backendRefs"]]
    assert (backend["group"], backend["kind"], backend["name"]) == ("inference.networking.k8s.io", "InferencePool", "zeroserve-pool")
    epp = docs["Deployment", picker["name"]]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert epp[epp.index("--pool-name") + 1] == "zeroserve-pool"
