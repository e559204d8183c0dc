"""The JSON log format: one object per line, a record's `extra=` fields as keys."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from proto.log_format import JsonFormatter
from service.observability.logging_setup import configure_logging


def make_record(**extra: object) -> logging.LogRecord:
    record = logging.LogRecord("zeroserve.test", logging.WARNING, __file__, 1, "hello %s", ("world",), None)
    record.__dict__.update(extra)
    return record


def test_json_line_has_the_standard_keys_and_the_extra_fields() -> None:
    line = JsonFormatter().format(make_record(request_id="r1", ttft=0.25))
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "zeroserve.test"
    assert entry["message"] == "hello world"
    assert entry["timestamp"].endswith("+00:00")
    assert (entry["request_id"], entry["ttft"]) == ("r1", 0.25)
    assert "args" not in entry and "msg" not in entry and "levelno" not in entry


def test_exceptions_stay_on_one_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in entry["exception"]


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text, json"):
        configure_logging("xml")
