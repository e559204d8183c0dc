"""Every engine setting, declared once: its name, type, default, help text and check.

`EngineConfig` is the one declaration. The command lines (`zeroserve serve`, `engine`,
`generate`, `bench throughput`) generate their engine flags from its fields
(service/flags/engine_flags.py), the gateway hands it to each engine process whole as JSON
(`python -m engine_proc --config`), `LLM(**kwargs)` takes its field names, and a test checks
the deploy files' flags against it. What only one process has (its engine index, its
gateway's addresses, the link) travels beside it, never in it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proto.settings import at_least, check_value, positive, setting

DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("auto", "gguf", "none", "q8_0", "q4_0")
LOAD_FORMATS = ("auto", "dummy")
SCHEDULING_POLICIES = ("fcfs", "priority")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {text!r}")
    return value


def _known_keys(config_class: type, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields`, once each is a field of `config_class` (else a ValueError naming the first that is not)."""
    known = [config_field.name for config_field in dataclasses.fields(config_class)]
    if unknown := [key for key in fields if key not in known]:
        raise ValueError(f"unknown key {unknown[0]!r}; known: {', '.join(known)}")
    return fields


def _check_json_object(text: str) -> None:
    if text:
        _json_object(text)


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
            raise ValueError(f"method {self.method!r} is not supported; only ngram")
        for name in ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "disable_by_batch_size"):
            value = getattr(self, name)
            if value is None and name == "disable_by_batch_size":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                "need prompt_lookup_min <= prompt_lookup_max, got "
                f"{self.prompt_lookup_min} and {self.prompt_lookup_max}"
            )

    @staticmethod
    def from_json(text: str) -> SpeculativeConfig:
        return SpeculativeConfig(**_known_keys(SpeculativeConfig, _json_object(text)))


STRUCTURED_OUTPUT_BACKENDS = ("auto", "xgrammar", "guidance")


@dataclass(frozen=True)
class StructuredOutputsConfig:
    """Structured outputs, vLLM's `--structured-outputs-config` keys, and how long a grammar may compile."""

    backend: str = "auto"  # auto: xgrammar; guidance: llguidance (vLLM's name for it)
    # NOTE: a request whose grammar is still compiling after this long gets a 400 naming its
    # constraint (a typical schema compiles in tens of milliseconds; a pathological one can take
    # minutes, and the compile thread cannot be stopped, so later grammars wait behind it).
    compile_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.backend not in STRUCTURED_OUTPUT_BACKENDS:
            raise ValueError(f"backend {self.backend!r} is not supported; supported: {', '.join(STRUCTURED_OUTPUT_BACKENDS)}")
        timeout = self.compile_timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"compile_timeout_s must be a positive number of seconds, got {timeout!r}")

    @staticmethod
    def from_json(text: str) -> StructuredOutputsConfig:
        return StructuredOutputsConfig(**_known_keys(StructuredOutputsConfig, _json_object(text)))


KV_EVENT_PUBLISHERS = ("null", "zmq")
KV_EVENT_FORMATS = ("array", "map")


@dataclass(frozen=True)
class KVEventsConfig:
    """KV cache events for prefix-aware routers, vLLM's `--kv-events-config` keys (engine_proc/kv_events.py)."""

    enable_kv_cache_events: bool = False
    # NOTE: zmq by default, as vLLM resolves an unset publisher once events are enabled.
    publisher: str = "zmq"
    # NOTE: loopback by default: the events carry every cached prompt's token ids, unauthenticated.
    endpoint: str = "tcp://127.0.0.1:5557"  # a wildcard or loopback host (or ipc://) binds, another host connects
    replay_endpoint: str | None = None  # a ROUTER socket that resends batches from a sequence number
    buffer_steps: int = 10_000  # batches kept for replay
    hwm: int = 100_000
    max_queue_size: int = 100_000  # batches waiting for the publisher thread; more are dropped
    topic: str = ""
    # NOTE: not a vLLM key: vLLM sent each event as an array until mid-2026 and as a map since
    # (vllm-project/vllm#42892); most routers still read only arrays.
    event_format: str = "array"

    def __post_init__(self) -> None:
        if self.event_format not in KV_EVENT_FORMATS:
            raise ValueError(f"event_format {self.event_format!r} is not supported; supported: {', '.join(KV_EVENT_FORMATS)}")
        if not isinstance(self.enable_kv_cache_events, bool):
            raise ValueError(f"enable_kv_cache_events must be true or false, got {self.enable_kv_cache_events!r}")
        if self.publisher not in KV_EVENT_PUBLISHERS:
            raise ValueError(f"publisher {self.publisher!r} is not supported; supported: {', '.join(KV_EVENT_PUBLISHERS)}")
        for name in ("endpoint", "replay_endpoint", "topic"):
            value = getattr(self, name)
            if not isinstance(value, str) and not (value is None and name == "replay_endpoint"):
                raise ValueError(f"{name} must be a string, got {value!r}")
            if name != "topic" and value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ValueError(f"{name} must be a tcp://, ipc:// or inproc:// address, got {value!r}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    @property
    def is_publishing(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def offset(self, num_ports: int) -> KVEventsConfig:
        """The same events `num_ports` ports further on (`offset_endpoint`), for engines that share the setting."""
        replay = None if self.replay_endpoint is None else offset_endpoint(self.replay_endpoint, num_ports)
        return dataclasses.replace(self, endpoint=offset_endpoint(self.endpoint, num_ports), replay_endpoint=replay)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str) -> KVEventsConfig:
        return KVEventsConfig(**_known_keys(KVEventsConfig, _json_object(text)))


def offset_endpoint(endpoint: str, engine_index: int) -> str:
    """Engine N's endpoint: N added to a tcp port, `_dpN` after an ipc or inproc path (vLLM's rule)."""
    if engine_index <= 0:
        return endpoint
    if endpoint.startswith(("ipc://", "inproc://")):
        return f"{endpoint}_dp{engine_index}"
    host, _, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not port.isdigit():
        raise ValueError(f"KV events endpoint {endpoint!r} is not tcp://host:port, ipc:// or inproc://")
    return f"{host}:{int(port) + engine_index}"


def _checks_json_of(
    config_class: type[SpeculativeConfig] | type[StructuredOutputsConfig] | type[KVEventsConfig],
) -> Callable[[str], None]:
    """The check of a setting that holds `config_class` as JSON (empty: not set)."""

    def check(text: str) -> None:
        if text:
            config_class.from_json(text)

    return check


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine needs to load its model and serve; the same in every engine process."""

    model_path: str = field(default="", metadata={"help": "a .gguf file or a Hugging Face model directory"})
    model_name: str = field(default="", metadata={"help": "the name clients ask for"})
    dtype: str = setting(
        "auto", "activations and KV cache; auto: bfloat16 for a GGUF with 4-bit weights, else the "
        "checkpoint's dtype; float32 matches transformers token for token", choices=DTYPES,
    )
    quantization: str = setting(
        "auto", "auto: a GGUF's quantized weights run on their own blocks when the dtype is "
        "bfloat16; gguf: require that; none: dequantize every weight; q8_0 / q4_0: round a folder's "
        "(or a float GGUF's) projections to those blocks at load, weight-only", choices=QUANTIZATIONS,
    )
    load_format: str = setting(
        "auto", "dummy: random weights of the model's shape, reading only its config", choices=LOAD_FORMATS,
    )
    hf_overrides: str = setting(
        "", 'model config fields to replace, a JSON object, e.g. \'{"num_hidden_layers": 1, "hidden_size": 64}\' (default: none)',
        check=_check_json_object, is_json=True,
    )
    speculative_config: str = setting(
        "", "speculative decoding for greedy requests (exact: same tokens, fewer steps when text "
        'repeats): n-gram drafts from the context, e.g. \'{"method": "ngram", "num_speculative_tokens": 3, '
        '"prompt_lookup_max": 4}\'; other keys: prompt_lookup_min, disable_by_batch_size (default: off)',
        check=_checks_json_of(SpeculativeConfig), is_json=True,
    )
    structured_outputs_config: str = setting(
        "", 'structured outputs: the grammar backend and how long one may compile before its request '
        'gets a 400, e.g. \'{"backend": "guidance", "compile_timeout_s": 10}\' (backends: xgrammar, '
        'guidance (llguidance); default: xgrammar, 10 s)',
        check=_checks_json_of(StructuredOutputsConfig), is_json=True,
    )
    kv_events_config: str = setting(
        "", "KV cache events for prefix-aware routers (llm-d, Dynamo, AIBrix) in vLLM's wire format, vLLM's keys: "
        '\'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", '
        '"replay_endpoint": "tcp://127.0.0.1:5567", "topic": "kv-events"}\'; others: buffer_steps, hwm, max_queue_size, '
        'event_format ("array", vLLM\'s layout before mid-2026 and most routers\', or "map", newer vLLM\'s); '
        "a loopback host (the default endpoint) or a path binds, tcp://*:PORT binds every interface (unauthenticated: "
        "a warning), another host is a collector to connect to; engine N adds N to the ports (default: off)",
        check=_checks_json_of(KVEventsConfig), is_json=True,
    )
    device: str = setting("auto", "torch device of the engine: auto (CUDA when present), cpu, cuda, cuda:N")
    block_size: int = setting(16, "tokens per KV cache block", check=at_least(1))
    kv_cache_memory_gib: float | None = setting(
        None, "GiB for the KV cache (default: a share of free GPU memory, or of free RAM on the CPU)",
        flag="--kv-cache-memory", check=positive,
    )
    max_model_len: int | None = setting(None, "context length (default: the model's)", check=at_least(1))
    max_num_seqs: int = setting(64, "most sequences in one step", check=at_least(1))
    # NOTE: 256 (OpenVINO GenAI's prompt tokens a step, too): a prompt longer than what is left of a
    # step's budget is prefilled in chunks, so running streams keep their pace. 16 clients in a closed loop
    # on the 1B-shaped Q4_K_M (benchmarks/token_budget.py, README "First tokens under load"): TTFT p50
    # 1.1 s against 2.1 s at 512 and 4.8 s at 2048, ITL p99 halved, the same output tokens/s.
    max_num_batched_tokens: int = setting(
        256, "token budget of one step: prompts longer than what is left of it are prefilled in chunks, "
        "so running streams keep their pace", check=at_least(1),
    )
    batch_invariant: bool = setting(
        True, "each request's tokens independent of what shares its steps: one row-invariant kernel per "
        "matmul at every batch size, so greedy and seeded requests give the same text alone, in any batch, "
        "from the prefix cache or resumed (default: on; off lets the load-time plan switch kernels by batch size)",
    )
    num_threads: int | None = setting(None, "torch threads in the engine (default: all cores)", check=at_least(1))
    enable_prefix_caching: bool = setting(True, "reuse the KV cache of shared prompt prefixes (default: on)")
    scheduling_policy: str = setting(
        "fcfs", "fcfs, or priority: lower `priority` values first, ties by arrival", choices=SCHEDULING_POLICIES,
    )

    def __post_init__(self) -> None:
        for config_field in dataclasses.fields(self):
            check_value(config_field, getattr(self, config_field.name))

    @property
    def hf_overrides_dict(self) -> dict[str, Any]:
        return _json_object(self.hf_overrides) if self.hf_overrides else {}

    @property
    def speculative(self) -> SpeculativeConfig | None:
        return SpeculativeConfig.from_json(self.speculative_config) if self.speculative_config else None

    @property
    def structured_outputs(self) -> StructuredOutputsConfig:
        if not self.structured_outputs_config:
            return StructuredOutputsConfig()
        return StructuredOutputsConfig.from_json(self.structured_outputs_config)

    @property
    def kv_events(self) -> KVEventsConfig:
        return KVEventsConfig.from_json(self.kv_events_config) if self.kv_events_config else KVEventsConfig()

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @staticmethod
    def from_json(text: str) -> EngineConfig:
        return EngineConfig(**settings_from(_json_object(text)))


def settings_from(values: dict[str, Any]) -> dict[str, Any]:
    """`values` as EngineConfig keyword arguments; a JSON field may be given as a dict."""
    known = {config_field.name: config_field for config_field in dataclasses.fields(EngineConfig)}
    if unknown := sorted(set(values) - set(known)):
        raise ValueError(f"unknown engine settings {unknown}; known: {', '.join(known)}")
    return {
        name: json.dumps(value) if known[name].metadata.get("is_json") and isinstance(value, dict) else value
        for name, value in values.items()
    }
