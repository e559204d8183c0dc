"""The route table: every row served by the app and in the OpenAPI document, and the sets the middlewares read
derived from the rows (what answers without a key, while loading, while draining)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from starlette.routing import Match

from service.api.app import create_app
from service.api.routes import ROUTES, batch_endpoints, openapi_document, path_rules
from service.openai.batch_generate import BatchEndpoints, read_line
from service.openai.errors import APIError

ROOT = Path(__file__).resolve().parents[3]
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}


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


def test_the_paths_a_batch_may_call_are_the_rows_that_say_so() -> None:
    endpoints = batch_endpoints()
    assert endpoints.bodies == {row.path: row.body for row in ROUTES if row.is_batch_endpoint}
    assert set(endpoints.bodies) == {"/v1/chat/completions", "/v1/completions"}
    chat = read_line(0, json.dumps({"custom_id": "a", "url": "/v1/chat/completions", "body": CHAT_BODY}))
    assert chat.request_body(endpoints).messages[0].content == "Hi"
    plain = read_line(1, json.dumps(CHAT_BODY))
    assert endpoints.url_of(plain) == "/v1/chat/completions"
    # NOTE: a path no row lets a batch call is refused, naming the line's url.
    responses = read_line(2, json.dumps({"url": "/v1/responses", "body": {"input": "Hi"}}))
    with pytest.raises(APIError) as refused:
        responses.request_body(endpoints)
    assert refused.value.param == "url" and "/v1/chat/completions" in refused.value.message
    without_chat = BatchEndpoints({path: body for path, body in endpoints.bodies.items() if path != "/v1/chat/completions"})
    with pytest.raises(APIError):
        chat.request_body(without_chat)


# NOTE: the load generator (`zeroserve bench`) is a client of any OpenAI-compatible server: the paths it
# calls are the API's, not this server's table.
CLIENT_ROOM = ROOT / "service" / "bench"


def test_each_path_is_a_string_in_the_route_table_alone() -> None:
    paths = {row.path for row in ROUTES if row.path != "/"} | {row.openapi_path for row in ROUTES if row.path != "/"}
    found = []
    for path in (ROOT / "service").rglob("*.py"):
        if path == ROOT / "service" / "api" / "routes.py" or path.is_relative_to(CLIENT_ROOM):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in paths:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert found == []
