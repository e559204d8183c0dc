"""The Grafana dashboard charts every metric the gateway exposes, and only those."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.observability.metrics import PrometheusStatLogger
from service.observability.stats import FinishedRequestStats, IterationStats

DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "zeroserve-dashboard.json"


def exposed_sample_names() -> set[str]:
    stat_logger = PrometheusStatLogger("m")
    done = FinishedRequestStats("r", "stop", 1.0, 1, 1, 0, 0.1, 0.0, 0.0, 0.0, 0.0)
    stat_logger.record(0, None, IterationStats(finished_requests=[done]))
    text = generate_latest(stat_logger.registry).decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def family_of(sample_name: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", sample_name)


def panel_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]


def test_every_metric_is_charted_and_every_charted_name_exists() -> None:
    exposed = exposed_sample_names()
    charted = {name for expr in panel_expressions() for name in re.findall(r"zeroserve:[a-z0-9_]+", expr)}
    assert charted <= exposed, charted - exposed
    assert {family_of(name) for name in charted} == {family_of(name) for name in exposed if not name.endswith("_created")}


def test_histograms_show_p50_p90_p99() -> None:
    expressions = "\n".join(panel_expressions())
    for name in ("time_to_first_token", "inter_token_latency", "e2e_request_latency", "request_queue_time"):
        for quantile in ("0.5", "0.9", "0.99"):
            assert f"histogram_quantile({quantile}, sum by (le, model_name, engine) (rate(zeroserve:{name}_seconds_bucket" in expressions


def test_panels_use_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["query"] == "prometheus"
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${" + variable["name"] + "}"
