"""The log line formats every zeroserve process writes (text, or one JSON object per line), and
the one logging setup every process uses."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

LOG_FORMATS = ("text", "json")
DEFAULT_LOG_FORMAT = "text"
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

# NOTE: every attribute a bare LogRecord has; anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """A record as one JSON line: timestamp, level, logger, message, and its `extra=` fields as keys."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(
    log_format: str = "text", text_format: str = TEXT_FORMAT, record_filter: logging.Filter | None = None,
    level: int = logging.INFO,
) -> None:
    """Sends the root logger's records to stderr as `log_format` lines (once: a configured root
    is left alone); text lines in `text_format`."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(text_format))
    if record_filter is not None:
        handler.addFilter(record_filter)
    logging.basicConfig(level=level, handlers=[handler])
