"""SamplingParams as callers give them: the engine's, plus what the gateway does itself (`n`
samples by fan-out, each its own engine request; stop strings on the detokenized text)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from proto import engine_input
from proto.engine_input import check_ranges

_GATEWAY_RANGES: engine_input.Ranges = (
    ("n", lambda p: p.n >= 1, ">= 1"),
    ("stop", lambda p: all(isinstance(s, str) for s in p.stop), "a string or a list of strings"),
)
_ENGINE_FIELDS = tuple(f.name for f in fields(engine_input.SamplingParams))
_INT64 = 2**63


@dataclass(slots=True)
class SamplingParams(engine_input.SamplingParams):
    """How a request is sampled and when it stops (`from service import SamplingParams`)."""

    n: int = 1
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        engine_input.SamplingParams.__post_init__(self)
        check_ranges(self, _GATEWAY_RANGES)

    def engine_params(self, **changes: Any) -> engine_input.SamplingParams:
        """What the engine is sent: these params less the gateway's own fields."""
        values = {name: getattr(self, name) for name in _ENGINE_FIELDS}
        return engine_input.SamplingParams(**(values | changes))

    def sample_params(self, index: int) -> engine_input.SamplingParams:
        """What sample `index` of the `n` is sent: a request seeded s draws sample i with seed s + i
        (wrapped to int64), distinct and the same every time."""
        if self.seed is None or index == 0:
            return self.engine_params()
        return self.engine_params(seed=(self.seed + index + _INT64) % (2 * _INT64) - _INT64)


def generation_defaults_of(generation_config: Mapping[str, float]) -> dict[str, Any]:
    """SamplingParams' values under a model's generation config (temperature, top_p, top_k,
    min_p; a top_k of -1 or 0 means none), as vLLM reads it."""
    top_k = int(generation_config.get("top_k", -1))
    return {
        "temperature": generation_config.get("temperature", 1.0),
        "top_p": generation_config.get("top_p", 1.0),
        "top_k": None if top_k in (-1, 0) else top_k,
        "min_p": generation_config.get("min_p", 0.0),
    }
