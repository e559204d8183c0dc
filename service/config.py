"""The gateway process's configuration, frozen and validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from proto.engine_config import EngineConfig
from service.curve import LinkSettings


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
    # NOTE: set only in one of several gateway processes (service/api_servers.py starts them).
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
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if self.data_parallel_size < 0 or (self.data_parallel_size == 0 and self.link.engine_address is None):
            raise ValueError(
                f"--data-parallel-size must be >= 1 (or 0 with --engine-address), got {self.data_parallel_size}"
            )
        if self.api_server_count < 1:
            raise ValueError(f"--api-server-count must be >= 1, got {self.api_server_count}")
        if self.api_server_count > 1 and (
            self.data_parallel_size < 1 or self.link.engine_address is not None or self.link.is_curve
        ):
            raise ValueError(
                "--api-server-count > 1 shares the gateway's own engines (--data-parallel-size >= 1); "
                "it does not take --engine-address or CURVE keys"
            )
        if self.max_n < 1:
            raise ValueError(f"--max-n must be >= 1, got {self.max_n}")
        if self.max_request_body_bytes < 1:
            raise ValueError(f"--max-request-body-bytes must be >= 1, got {self.max_request_body_bytes}")
        unknown = {key for key, _ in self.generation_config} - {"temperature", "top_p", "top_k", "min_p"}
        if unknown:
            raise ValueError(f"--override-generation-config: unknown keys {sorted(unknown)}")
        if any(not key or key != key.strip() or "," in key for key in self.api_keys):
            raise ValueError("--api-key: keys must be non-empty, without commas or surrounding spaces")
        if self.max_num_queued_requests < 0:
            raise ValueError(f"--max-num-queued-requests must be >= 0, got {self.max_num_queued_requests}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"--request-timeout must be > 0, got {self.request_timeout_s}")
        if not self.shutdown_timeout_s >= 0:
            raise ValueError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout_s}")
        if not self.sse_keepalive_s >= 0:
            raise ValueError(f"--sse-keepalive must be >= 0, got {self.sse_keepalive_s}")
        if self.max_header_bytes < 1024:
            raise ValueError(f"--max-header-bytes must be >= 1024, got {self.max_header_bytes}")

    @property
    def max_num_in_flight(self) -> int:
        """Generation requests one gateway process holds at once: its share (of --api-server-count)
        of the engines' batches plus the queue."""
        total = self.engine.max_num_seqs * max(self.data_parallel_size, 1) + self.max_num_queued_requests
        return -(-total // self.api_server_count)
