"""The route table: every row served by the app and in the OpenAPI document, and the sets the middlewares read
derived from the rows (what answers without a key, while loading, while draining)."""

from __future__ import annotations

import re

from starlette.routing import Match

from service.api.app import create_app
from service.api.routes import ROUTES, openapi_document, path_rules


def _concrete(path: str) -> str:
    return re.sub(r"{\w+(:\w+)?}", "x1", path)


def test_every_row_is_served_by_the_app_and_documented() -> None:
    app = create_app(None)
    document = openapi_document()
    for row in ROUTES:
        scope = {"type": "http", "path": _concrete(row.path), "method": row.method}
        assert any(route.matches(scope)[0] is Match.FULL for route in app.routes), (row.path, row.method)
        assert row.method.lower() in document["paths"][row.openapi_path], (row.path, row.method)
    assert len({(row.path, row.method) for row in ROUTES}) == len(ROUTES)


def test_only_these_routes_answer_without_an_api_key() -> None:
    paths, prefixes = path_rules().keyless
    assert paths == {"/health", "/livez", "/openapi.json", "/metrics", "/", "/dashboard"}
    assert prefixes == ("/health/", "/static/")
    assert "/metrics" not in path_rules(is_metrics_auth=True).keyless[0]


def test_loading_and_draining_serve_health_and_the_pages_alone() -> None:
    rules = path_rules()
    assert rules.open_while_loading == (frozenset({"/health", "/livez", "/version", "/", "/dashboard"}), ("/static/",))
    assert rules.open_while_draining[0] == rules.open_while_loading[0] | {"/metrics"}
    assert rules.generation <= rules.model_routed and "/v1/messages" in rules.anthropic
