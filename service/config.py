"""The gateway process's configuration, frozen and validated on construction."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proto.engine_config import EngineConfig
from service.client.curve import LinkSettings


@dataclass(frozen=True)
class GatewayConfig:
    """What `zeroserve serve` was asked to do."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ()
    generation_config: tuple[tuple[str, float], ...] = ()
    engine: EngineConfig = field(default_factory=EngineConfig)
    log_format: str = "text"  # the gateway's and its engines' log lines
    data_parallel_size: int = 1
    link: LinkSettings = field(default_factory=LinkSettings)
    api_server_count: int = 1
    # NOTE: set only in one of several gateway processes (service/api/api_servers.py starts them).
    api_server_index: int | None = None
    listen_fd: int | None = None
    engine_addresses: tuple[str, str] | None = None
    max_n: int = 16
    max_request_body_bytes: int = 8 * 2**20
    api_keys: tuple[str, ...] = ()
    is_metrics_auth: bool = False
    max_num_queued_requests: int = 256
    request_timeout_s: float | None = None
    shutdown_timeout_s: float = 30.0
    sse_keepalive_s: float = 15.0
    max_header_bytes: int = 16 * 2**10

    def __post_init__(self) -> None:
        for flag, name, is_valid, allowed in _RANGES:
            if not is_valid(getattr(self, name)):
                raise ValueError(f"{flag} must be {allowed}, got {getattr(self, name)}")
        if self.data_parallel_size == 0 and self.link.engine_address is None:
            raise ValueError("--data-parallel-size must be >= 1 (or 0 with --engine-address), got 0")
        if self.api_server_count > 1 and (
            self.data_parallel_size < 1 or self.link.engine_address is not None or self.link.is_curve
        ):
            raise ValueError(
                "--api-server-count > 1 shares the gateway's own engines (--data-parallel-size >= 1); "
                "it does not take --engine-address or CURVE keys"
            )
        unknown = {key for key, _ in self.generation_config} - {"temperature", "top_p", "top_k", "min_p"}
        if unknown:
            raise ValueError(f"--override-generation-config: unknown keys {sorted(unknown)}")
        if any(not key or key != key.strip() or "," in key for key in self.api_keys):
            raise ValueError("--api-key: keys must be non-empty, without commas or surrounding spaces")

    @property
    def max_num_in_flight(self) -> int:
        """Generation requests one gateway process holds at once: its share (of --api-server-count)
        of the engines' batches plus the queue."""
        total = self.engine.max_num_seqs * max(self.data_parallel_size, 1) + self.max_num_queued_requests
        return -(-total // self.api_server_count)


# The gateway's flags with a range: the flag, the config field it sets, its test, the values it takes.
_RANGES: tuple[tuple[str, str, Callable[[Any], bool], str], ...] = (
    ("--port", "port", lambda v: 0 <= v < 65536, "in [0, 65535]"),
    ("--data-parallel-size", "data_parallel_size", lambda v: v >= 0, ">= 1 (or 0 with --engine-address)"),
    ("--api-server-count", "api_server_count", lambda v: v >= 1, ">= 1"),
    ("--max-n", "max_n", lambda v: v >= 1, ">= 1"),
    ("--max-request-body-bytes", "max_request_body_bytes", lambda v: v >= 1, ">= 1"),
    ("--max-num-queued-requests", "max_num_queued_requests", lambda v: v >= 0, ">= 0"),
    ("--request-timeout", "request_timeout_s", lambda v: v is None or v > 0, "> 0"),
    ("--shutdown-timeout", "shutdown_timeout_s", lambda v: v >= 0, ">= 0"),
    ("--sse-keepalive", "sse_keepalive_s", lambda v: v >= 0, ">= 0"),
    ("--max-header-bytes", "max_header_bytes", lambda v: v >= 1024, ">= 1024"),
)
