"""The Gateway API Inference Extension's endpoint picker reading a scrape of /metrics, as its Go code does:
which series of a family it takes and what it keeps of a pod."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

# NOTE: the picker's built-in vLLM mapping, verbatim: defaultEngineConfigs in
# pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go and the --*-metric flags'
# defaults in pkg/epp/server/options.go, kubernetes-sigs/gateway-api-inference-extension at
# 1748e829d1161147aaf35e76699ec86fd88406d2 (2026-06-16).
VLLM_MAPPING = {
    "QueuedRequestsSpec": "vllm:num_requests_waiting",
    "RunningRequestsSpec": "vllm:num_requests_running",
    "KVUsageSpec": "vllm:kv_cache_usage_perc",
    "LoRASpec": "vllm:lora_requests_info",
    "CacheInfoSpec": "vllm:cache_config_info",
}

@dataclass
class PodMetrics:
    """What the picker keeps of a pod (fwkdl.Metrics), and the errors its extractor reports."""

    waiting_queue_size: int = 0
    running_requests_size: int = 0
    kv_cache_usage_percent: float = 0.0
    max_active_models: int = 0
    active_models: dict[str, int] = field(default_factory=dict)
    waiting_models: dict[str, int] = field(default_factory=dict)
    cache_block_size: int = 0
    cache_num_blocks: int = 0
    errors: list[str] = field(default_factory=list)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """parseStringToSpec: `name{label=value,...}`, labels optional, quotes optional."""
    match = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?", spec)
    assert match is not None, spec
    pairs = re.findall(r'(\w+)\s*=\s*"?([^",}]*)"?', match.group(2) or "")
    return match.group(1), dict(pairs)


def latest_metric(families: dict[str, Metric], spec: str, is_lora: bool = False) -> Sample:
    """Spec.getLatestMetric (the newest matching series by timestamp, the first when none has one),
    or LoRASpec.getLatestMetric (the matching series of the largest value)."""
    name, labels = parse_spec(spec)
    family = families.get(name)
    if family is None:
        raise LookupError(f"metric family {name!r} not found")
    if not family.samples:
        raise LookupError(f"no metrics found for {name!r}")
    latest, recent = None, -1.0
    for sample in family.samples:
        if all(sample.labels.get(k) == v for k, v in labels.items()):
            # NOTE: Go's GetTimestampMs() is 0 for a sample without one.
            key = extract_value(family, sample) if is_lora else float(sample.timestamp or 0)
            if key > recent:
                latest, recent = sample, key
    if latest is None:
        raise LookupError(f"no matching metric found for {name!r} with labels {labels}")
    return latest


def extract_value(family: Metric, sample: Sample) -> float:
    """extractValue: a gauge's or counter's value, 0 for any other type."""
    return sample.value if family.type in ("gauge", "counter") else 0.0


def read_as_the_picker(text: str, mapping: dict[str, str]) -> PodMetrics:
    """Extractor.Extract on the text a scrape returned, parsed as the picker's text parser would."""
    families = {family.name: family for family in text_string_to_metric_families(text)}
    pod = PodMetrics()
    numbers = (("QueuedRequestsSpec", "waiting_queue_size", int), ("RunningRequestsSpec", "running_requests_size", int),
               ("KVUsageSpec", "kv_cache_usage_percent", float))
    for spec_key, attribute, convert in numbers:
        try:
            sample = latest_metric(families, mapping[spec_key])
        except LookupError as error:
            pod.errors.append(str(error))
            continue
        setattr(pod, attribute, convert(extract_value(families[parse_spec(mapping[spec_key])[0]], sample)))
    try:
        lora = latest_metric(families, mapping["LoRASpec"], is_lora=True).labels
        pod.active_models = {a.strip(): 0 for a in lora.get("running_lora_adapters", "").split(",") if a.strip()}
        pod.waiting_models = {a.strip(): 0 for a in lora.get("waiting_lora_adapters", "").split(",") if a.strip()}
        pod.max_active_models = int(lora["max_lora"]) if lora.get("max_lora") else 0
    except LookupError as error:
        pod.errors.append(str(error))
    try:
        cache = latest_metric(families, mapping["CacheInfoSpec"]).labels
        pod.cache_block_size = int(cache.get("block_size") or 0)
        pod.cache_num_blocks = int(cache.get("num_gpu_blocks") or 0)
    except LookupError as error:
        pod.errors.append(str(error))
    return pod
