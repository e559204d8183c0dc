"""The gateway process's configuration, frozen and validated on construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.engine_launcher import EngineArgs


@dataclass(frozen=True)
class GatewayConfig:
    """What `zeroserve serve` was asked to do."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_names: tuple[str, ...] = ()
    generation_config: tuple[tuple[str, float], ...] = ()
    engine: EngineArgs = field(default_factory=lambda: EngineArgs(model_path="", model_name=""))
    max_n: int = 16
    max_request_body_bytes: int = 8 * 2**20

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if self.max_n < 1:
            raise ValueError(f"--max-n must be >= 1, got {self.max_n}")
        if self.max_request_body_bytes < 1:
            raise ValueError(f"--max-request-body-bytes must be >= 1, got {self.max_request_body_bytes}")
        unknown = {key for key, _ in self.generation_config} - {"temperature", "top_p", "top_k", "min_p"}
        if unknown:
            raise ValueError(f"--override-generation-config: unknown keys {sorted(unknown)}")
