"""The gateway's log format: plain text lines, or one JSON object per line."""

from __future__ import annotations

import logging

from proto.log_format import LOG_FORMATS, TEXT_FORMAT, JsonFormatter

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging"]

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
