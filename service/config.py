"""The gateway process's configuration, frozen and validated on construction; its flags
(`zeroserve serve`'s own) are generated from the fields that declare one."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from proto.engine_config import EngineConfig
from proto.log_format import LOG_FORMATS
from proto.settings import at_least, check_value, flag_of, in_range, positive, setting
from service.client.curve import LinkSettings


@dataclass(frozen=True)
class GatewayConfig:
    """What `zeroserve serve` was asked to do."""

    model: str
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port to listen on", check=in_range(0, 65535))
    served_model_names: tuple[str, ...] = ()
    generation_config: tuple[tuple[str, float], ...] = ()
    engine: EngineConfig = field(default_factory=EngineConfig)
    log_format: str = setting(
        "text", "text lines, or one JSON object per line; finished requests' figures become keys (the "
        "engines' lines follow it)", choices=LOG_FORMATS,
    )
    data_parallel_size: int = setting(
        1, "engine processes this gateway starts; each request goes to the least loaded "
        "(0: none, engines join from other hosts through --engine-address)", check=at_least(0),
        group="scale-out", metavar="N",
    )
    link: LinkSettings = field(default_factory=LinkSettings)
    api_server_count: int = setting(
        1, "gateway processes sharing the port, each connected to every engine", check=at_least(1),
        group="scale-out", metavar="K",
    )
    # NOTE: set only in one of several gateway processes (service/api/api_servers.py starts them).
    api_server_index: int | None = None
    listen_fd: int | None = None
    engine_addresses: tuple[str, str] | None = None
    max_n: int = setting(16, "most choices one request may ask for", check=at_least(1))
    max_request_body_bytes: int = setting(
        8 * 2**20, "larger request bodies get 413 before parsing", check=at_least(1)
    )
    api_keys: tuple[str, ...] = ()
    is_metrics_auth: bool = setting(
        False, "/metrics asks for an API key too (default: off)", flag="--metrics-auth", group="operations"
    )
    max_num_queued_requests: int = setting(
        256, "requests held beyond --max-num-seqs; past them a request gets 429 and Retry-After",
        check=at_least(0), group="operations", metavar="N",
    )
    request_timeout_s: float | None = setting(
        None, "abort a request that runs longer: 408 if not streamed, else finish_reason 'abort' and an "
        "error event (default: none)", flag="--request-timeout", check=positive, group="operations",
        metavar="SECONDS",
    )
    shutdown_timeout_s: float = setting(
        30.0, "on SIGTERM, how long requests in flight may finish before they are aborted",
        flag="--shutdown-timeout", check=at_least(0), group="operations", metavar="SECONDS",
    )
    sse_keepalive_s: float = setting(
        15.0, "a `: ping` comment this often on a waiting stream (0: none)", flag="--sse-keepalive",
        check=at_least(0), group="operations", metavar="SECONDS",
    )
    max_header_bytes: int = setting(
        16 * 2**10, "a larger request head (request line and headers) gets 431", check=at_least(1024),
        group="operations", metavar="N",
    )

    def __post_init__(self) -> None:
        for config_field in dataclasses.fields(self):
            if "flag" in config_field.metadata:
                check_value(config_field, getattr(self, config_field.name), label=flag_of(config_field))
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
