"""The gateway's logging: proto's setup, with a gateway process of several tagging its lines."""

from __future__ import annotations

import logging

from proto.log_format import LOG_FORMATS, TEXT_FORMAT
from proto.log_format import configure_logging as configure_process_logging

__all__ = ["LOG_FORMATS", "configure_logging"]


def configure_logging(log_format: str = "text", level: int = logging.INFO, api_server: int | None = None) -> None:
    """Sends the root logger's records to stderr in the given format (once: a configured root is
    left alone); one of several gateway processes tags its lines with its `api_server` index."""
    if api_server is None:
        configure_process_logging(log_format, level=level)
        return
    text_format = TEXT_FORMAT.replace("%(name)s", "api-server-%(api_server)s %(name)s")
    configure_process_logging(log_format, text_format, _ApiServerTag(api_server), level)


class _ApiServerTag(logging.Filter):
    """Puts the gateway process's index on every record (a JSON key, or in the text line)."""

    def __init__(self, api_server: int) -> None:
        super().__init__()
        self.api_server = api_server

    def filter(self, record: logging.LogRecord) -> bool:
        record.api_server = self.api_server
        return True
