"""GET /metrics: the gateway's Prometheus metrics, in the classic text format."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import Response

from service.api.gateway_state import ServerPool, gateway_of
from service.models.model_pool import ModelStatus
from service.observability.merged_registry import MergedRegistry
from service.observability.picker_metrics import PICKER_FAMILIES, pod_families
from service.openai.errors import APIError

# NOTE: always the classic format, whatever the Accept header: every Prometheus reads it, and
# prometheus_client's OpenMetrics output turns the `:` of our names into `_` for scrapers that
# do not ask for UTF-8 names (Prometheus 2's default), which would break the dashboards.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def metrics(request: Request) -> Response:
    gateway = gateway_of(request.app)
    if gateway.pool is not None:
        return Response(generate_latest(pool_registry(gateway.pool)), headers={"Content-Type": CONTENT_TYPE})
    state = gateway.one_model()
    if state.metrics_registry is None:
        raise APIError("Metrics are not enabled on this server.", 404, error_type="not_found_error")
    return Response(generate_latest(state.metrics_registry), headers={"Content-Type": CONTENT_TYPE})


def pool_registry(pool: ServerPool) -> MergedRegistry:
    """Every loaded model's families (the picker's as one series over them), and each model's state and
    memory (zeroserve:model_*)."""
    status = GaugeMetricFamily(
        "zeroserve:model_status", "1 for each model's status now (loaded, loading, unloaded, failed).",
        labels=("model_name", "status"),
    )
    memory = GaugeMetricFamily(
        "zeroserve:model_memory_bytes", "Memory each model counts against --memory-budget (its engines' report).",
        labels=("model_name",),
    )
    for slot in pool.slots.values():
        for value in ModelStatus:
            status.add_metric((slot.id, value.value), float(slot.status is value))
        memory.add_metric((slot.id,), float(slot.memory_bytes if slot.is_holding_memory else 0))
    registries = [state.metrics_registry for state in pool.loaded_states if state.metrics_registry is not None]
    # NOTE: the endpoint picker reads one series of each of its families: the pod's, over its models.
    return MergedRegistry(lambda: registries, (status, memory, *pod_families(registries)), skip=PICKER_FAMILIES)
