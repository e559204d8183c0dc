"""GET /openapi.json, and hostile bodies for every route that takes one, in process on a fake engine:
bodies generated from the document's own schemas (hypothesis-jsonschema) and arbitrary JSON, at
least 2,000 in all; none may get a 5xx or hang, and the server serves normally afterwards."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy
from hypothesis_jsonschema import from_schema
from starlette.routing import Mount

from service.api.routes import ROUTES
from tests.service.api.fake_engine import FakeEngineClient

# Bodies per route drawn from its schema (fewer where drawing is slow: ~90 ms a chat body, ~500 ms an
# Anthropic one, whose schema names every block type and documented field), and of any JSON at all
# (unknown fields included): 2,000 in all.
NUM_FROM_SCHEMA = {"/v1/chat/completions": 150, "/v1/responses": 150, "/tokenize": 100, "/v1/completions": 300,
                   "/detokenize": 300, "/v1/messages": 50, "/v1/messages/count_tokens": 30}
NUM_ARBITRARY = 200

ARBITRARY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


def drawn(strategy: SearchStrategy[Any], count: int) -> list[Any]:
    """`count` examples of `strategy` (hypothesis drives the drawing; the test posts them)."""
    examples: list[Any] = []

    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: Any) -> None:
        examples.append(example)

    collect()
    return examples


async def test_the_openapi_document_describes_every_route_with_its_request_model(api: httpx.AsyncClient) -> None:
    response = await api.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"] == "3.1.0" and document["info"]["title"] == "zeroserve"
    schemas = document["components"]["schemas"]
    for row in ROUTES:
        assert row.method.lower() in document["paths"][row.openapi_path], (row.path, row.method)
        if row.body is None:
            continue
        ref = document["paths"][row.openapi_path]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{row.body.__name__}"
        assert set(row.body.model_fields) <= set(schemas[row.body.__name__]["properties"])
    # NOTE: a route's converter (`{request_id:path}`) is not part of an OpenAPI path template, and
    # a mounted folder's files are one templated path.
    app_paths = {
        re.sub(r":\w+}", "}", route.path) + ("/{path}" if isinstance(route, Mount) else "")
        for route in api._transport.app.routes  # type: ignore[attr-defined]
    }
    assert app_paths == set(document["paths"])
    # Every reference in the document resolves.
    text = json.dumps(document)
    for name in {part.split('"')[0] for part in text.split('"#/components/schemas/')[1:]}:
        assert name in schemas, name


def closed(components: dict[str, Any]) -> dict[str, Any]:
    """The schemas without their open `additionalProperties` (drawing extra keys of any JSON is ~4x
    slower; the arbitrary bodies carry unknown fields instead)."""
    schemas = {name: {**schema, "additionalProperties": False} if schema.get("additionalProperties") is True else schema
               for name, schema in components["schemas"].items()}
    return {**components, "schemas": schemas}


# NOTE: ~55 s (drawing from the schemas is half of it), so left out of `make test-fast`.
@pytest.mark.slow
async def test_thousands_of_generated_bodies_get_no_5xx_and_the_server_serves_on(
    api: httpx.AsyncClient, engine: FakeEngineClient
) -> None:
    engine.num_tokens_per_step = 64  # NOTE: long answers in few steps: the test is about the bodies
    document = (await api.get("/openapi.json")).json()
    num_posted = 0
    for path, model in ((row.path, row.body) for row in ROUTES if row.body is not None and row.path in NUM_FROM_SCHEMA):
        schema = {"$ref": f"#/components/schemas/{model.__name__}", "components": closed(document["components"])}
        bodies = drawn(from_schema(schema), NUM_FROM_SCHEMA[path]) + drawn(ARBITRARY_JSON, NUM_ARBITRARY)
        for body in bodies:
            # NOTE: as Python writes it: non-finite numbers become NaN/Infinity, which strict JSON lacks.
            response = await api.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
            assert response.status_code < 500, (path, body, response.text)
            if response.status_code >= 400 and path.startswith("/v1/messages"):
                assert response.json()["type"] == "error" and set(response.json()["error"]) == {"type", "message"}
            elif response.status_code >= 400:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}, response.text
            num_posted += 1
        raw = await api.post(path, content=b'{"truncated": ', headers={"content-type": "application/json"})
        assert raw.status_code == 400, raw.text
    assert num_posted >= 2000
    # NOTE: a drawn body may ask for a background Response, which generates on after its answer: give it time to end.
    for _ in range(400):
        if not engine.running_ids:
            break
        await asyncio.sleep(0.05)
    assert engine.running_ids == []
    answer = await api.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
