"""zeroserve's gateway side: `from service import LLM, SamplingParams` for offline use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.frontend.llm import LLM
    from service.frontend.llm_engine import LLMEngine
    from service.frontend.outputs import CompletionOutput, RequestOutput
    from service.frontend.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "LLMEngine", "RequestOutput", "SamplingParams"]

_WHERE = {
    "LLM": "service.frontend.llm",
    "LLMEngine": "service.frontend.llm_engine",
    "SamplingParams": "service.frontend.sampling_params",
    "RequestOutput": "service.frontend.outputs",
    "CompletionOutput": "service.frontend.outputs",
}


def __getattr__(name: str) -> Any:
    # NOTE: lazy, so `python -m service serve` does not import the offline machinery.
    if name not in _WHERE:
        raise AttributeError(f"module 'service' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
