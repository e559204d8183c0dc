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

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        unknown = {key for key, _ in self.generation_config} - {"temperature", "top_p", "top_k"}
        if unknown:
            raise ValueError(f"--override-generation-config: unknown keys {sorted(unknown)}")
