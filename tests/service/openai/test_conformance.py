"""The conformance table against vLLM's own models (vllm_fields.json, read from its wheel): every
field has a row, every implemented row names a test that exists, every other row says why, and
CONFORMANCE.md is the table as it stands (the refusals' 400s: test_vllm_fields_inproc.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.openai.conformance import (
    IMPLEMENTED,
    MARKDOWN_PATH,
    METRICS,
    NOT_APPLICABLE,
    REFUSED,
    REQUESTS,
    RESPONSES,
    Row,
    markdown,
    vllm_snapshot,
)

ROOT = Path(__file__).resolve().parents[3]
TABLES: dict[str, dict[str, Row]] = {name: rows for name, (rows, _) in REQUESTS.items()} | RESPONSES
ROWS = [pytest.param(model, name, row, id=f"{model}.{name}") for model, rows in (TABLES | {"metrics": METRICS}).items()
        for name, row in rows.items()]


@pytest.mark.parametrize("model", sorted(vllm_snapshot()["models"]))
def test_every_vllm_field_has_a_row_and_every_row_a_vllm_field(model: str) -> None:
    version = vllm_snapshot()["vllm_version"]
    fields = set(vllm_snapshot()["models"][model])
    rows = set(TABLES[model])
    assert not fields - rows, f"unknown: vLLM {version}'s {model} has {sorted(fields - rows)}; give each a row in conformance.py"
    assert not rows - fields, f"rows for fields vLLM {version}'s {model} does not have: {sorted(rows - fields)}"


def test_every_vllm_metric_family_has_a_row() -> None:
    families = set(vllm_snapshot()["metrics"])
    assert not families - set(METRICS), f"unknown: vLLM's families {sorted(families - set(METRICS))}"
    assert not set(METRICS) - families


@pytest.mark.parametrize(("model", "name", "row"), ROWS)
def test_each_row_is_shown_or_explained(model: str, name: str, row: Row) -> None:
    assert row.status in (IMPLEMENTED, REFUSED, NOT_APPLICABLE)
    assert "silently ignored" not in row.note
    if row.status == IMPLEMENTED:
        path, _, test_name = row.test.partition("::")
        source = (ROOT / path).read_text()
        assert re.search(rf"^(async )?def {test_name}\(", source, re.MULTILINE), f"{row.test} does not exist"
    else:
        assert row.note, f"{model}.{name} is {row.status} without saying why"
    if row.status == REFUSED:
        assert row.example is not None, f"{model}.{name} has no refused value for its test"


def test_the_markdown_table_is_current() -> None:
    assert MARKDOWN_PATH.read_text() == markdown(), "run: python -m service.openai.conformance"
