"""The engine process's configuration, frozen and validated on construction."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# NOTE: "auto": bfloat16 for a GGUF with 4-bit weights, else the checkpoint's own dtype (see loader).
DTYPES = ("auto", "float32", "bfloat16", "float16")
LOAD_FORMATS = ("auto", "dummy")
QUANTIZATIONS = ("auto", "gguf", "none")


@dataclass(frozen=True)
class EngineConfig:
    """Everything one engine process needs to start; values learned later go in EngineReady."""

    model_path: str
    model_name: str = ""
    engine_index: int = 0
    input_address: str = ""
    output_address: str = ""
    dtype: str = "float32"
    device: str = "auto"  # "auto": CUDA when torch sees a GPU, else the CPU
    block_size: int = 16
    kv_cache_memory_gib: float | None = None  # None: a share of free (GPU or host) memory
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_threads: int | None = None
    enable_prefix_caching: bool = True
    scheduling_policy: str = "fcfs"
    quantization: str = "auto"
    load_format: str = "auto"
    hf_overrides: str = ""  # a JSON object of model config fields to replace, or ""
    speculative_config: str = ""  # a JSON object (see SpeculativeConfig), or "" for none

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.load_format not in LOAD_FORMATS:
            raise ValueError(f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}")
        self.hf_overrides_dict  # noqa: B018 - validates the JSON
        self.speculative  # noqa: B018 - validates the JSON
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.scheduling_policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling_policy must be fcfs or priority, got {self.scheduling_policy!r}")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ValueError(f"kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")

    @property
    def hf_overrides_dict(self) -> dict[str, Any]:
        if not self.hf_overrides:
            return {}
        overrides = json.loads(self.hf_overrides)
        if not isinstance(overrides, dict):
            raise ValueError(f"hf_overrides must be a JSON object, got {self.hf_overrides!r}")
        return overrides

    @property
    def speculative(self) -> SpeculativeConfig | None:
        if not self.speculative_config:
            return None
        fields = json.loads(self.speculative_config)
        if not isinstance(fields, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {self.speculative_config!r}")
        known = set(SpeculativeConfig.__dataclass_fields__)
        if unknown := sorted(set(fields) - known):
            raise ValueError(f"unknown speculative_config keys {unknown}; known: {sorted(known)}")
        return SpeculativeConfig(**fields)


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding, vLLM's `--speculative-config` keys: n-gram (prompt lookup) drafts."""

    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    disable_by_batch_size: int | None = None  # no drafts while more requests than this run

    def __post_init__(self) -> None:
        if self.method != "ngram":
            raise ValueError(f"speculative_config method must be ngram, got {self.method!r}")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be an integer >= 1, got {self.num_speculative_tokens!r}")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                "need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(f"disable_by_batch_size must be >= 1, got {self.disable_by_batch_size}")
