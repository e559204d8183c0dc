"""The gateway's log format: plain text lines, or one JSON object per line."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

LOG_FORMATS = ("text", "json")
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


def configure_logging(log_format: str = "text", level: int = logging.INFO, api_server: int | None = None) -> None:
    """Sends the root logger's records to stderr in the given format (once: a configured root is
    left alone); one of several gateway processes tags its lines with its `api_server` index."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler()
    text_format = TEXT_FORMAT if api_server is None else TEXT_FORMAT.replace("%(name)s", "api-server-%(api_server)s %(name)s")
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(text_format))
    if api_server is not None:
        handler.addFilter(_ApiServerTag(api_server))
    logging.basicConfig(level=level, handlers=[handler])


class _ApiServerTag(logging.Filter):
    """Puts the gateway process's index on every record (a JSON key, or in the text line)."""

    def __init__(self, api_server: int) -> None:
        super().__init__()
        self.api_server = api_server

    def filter(self, record: logging.LogRecord) -> bool:
        record.api_server = self.api_server
        return True
