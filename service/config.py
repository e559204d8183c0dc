"""The gateway process's configuration, frozen and validated on construction; its flags
(`zeroserve serve`'s own) are generated from the fields that declare one."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from proto.engine_config import EngineConfig
from proto.log_format import DEFAULT_LOG_FORMAT, LOG_FORMATS
from proto.settings import at_least, check_settings, in_range, positive, setting
from service.client.curve import LinkSettings

GENERATION_KEYS = ("temperature", "top_p", "top_k", "min_p")


def _json_pairs(text: str) -> tuple[tuple[str, float], ...]:
    """The (key, value) pairs of a JSON object."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {text!r}")
    return tuple(value.items())


def _check_generation_keys(pairs: Sequence[tuple[str, float]]) -> None:
    unknown = {key for key, _ in pairs} - set(GENERATION_KEYS)
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")


_SIZE_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
               "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def _bytes_of(text: str) -> int:
    """Bytes of a size as people write it: 12GiB, 12G (GiB), 500MB, 1.5gib, or a plain number of bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if match is None or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"must be a size such as 16GiB, 512MiB or a number of bytes, got {text!r}")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])


def _check_api_keys(keys: Sequence[str]) -> None:
    if any(not key or key != key.strip() or "," in key for key in keys):
        raise ValueError("keys must be non-empty, without commas or surrounding spaces")


def origins_of(values: Sequence[str]) -> tuple[str, ...]:
    """--allowed-origins one origin an item (each value may hold several, comma-separated)."""
    return tuple(origin.strip() for value in values for origin in value.split(",") if origin.strip())


def _check_origins(values: Sequence[str]) -> None:
    for origin in origins_of(values):
        scheme, has_sep, rest = origin.partition("://")
        if origin != "*" and not (has_sep and scheme and rest and "/" not in rest):
            raise ValueError(f"each must be an origin such as https://example.com:8080 or *, got {origin!r}")


@dataclass(frozen=True)
class GatewayConfig:
    """What `zeroserve serve` was asked to do."""

    model: str
    # NOTE: every model named on the command line (`zeroserve serve A B`); `model` is the first.
    models: tuple[str, ...] = ()
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port to listen on", check=in_range(0, 65535))
    served_model_names: tuple[str, ...] = setting(
        (), "names clients use for the model (default: the model's)", flag="--served-model-name", nargs="+"
    )
    generation_config: tuple[tuple[str, float], ...] = setting(
        (), 'sampling defaults over the model\'s, e.g. \'{"temperature": 0.7}\' (default: none)',
        flag="--override-generation-config", parse=_json_pairs, check=_check_generation_keys, metavar="JSON",
    )
    engine: EngineConfig = field(default_factory=EngineConfig)
    log_format: str = setting(
        DEFAULT_LOG_FORMAT, "text lines, or one JSON object per line; finished requests' figures become keys (the "
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
    # NOTE: how one of several gateway processes learns its place (service/serving/api_servers.py sets them).
    api_server_index: int | None = setting(None, "this gateway process's index", check=at_least(0), is_hidden=True)
    listen_fd: int | None = setting(None, "the shared listening socket", check=at_least(0), is_hidden=True)
    engine_addresses: tuple[str, str] | None = setting(
        None, "this process's request and output addresses at the engines", nargs=2, is_hidden=True,
        metavar="ADDRESS",
    )
    max_n: int = setting(16, "most choices one request may ask for", check=at_least(1))
    tool_call_parser: str = setting(
        "auto", "parse the model's own tool calls (tool_choice auto) from its output in this format: hermes "
        "(<tool_call> JSON, as Qwen2/Qwen3 and Hermes models write them), harmony (gpt-oss's calls to "
        "functions); none: leave them in the content; auto: harmony for a model whose chat template is "
        "harmony's, else none", choices=("auto", "none", "hermes", "harmony"),
    )
    reasoning_parser: str = setting(
        "auto", "split the model's reasoning out of the answer into reasoning_content: qwen3 (answers that open "
        "with <think>), deepseek_r1 (answers that start reasoning), harmony (gpt-oss's analysis channel); none: "
        "leave it in the content; auto: harmony for a model whose chat template is harmony's, else none",
        choices=("auto", "none", "qwen3", "deepseek_r1", "harmony"),
    )
    max_request_body_bytes: int = setting(
        8 * 2**20, "larger request bodies get 413 before parsing", check=at_least(1)
    )
    max_upload_bytes: int = setting(
        200 * 2**20, "a larger file upload (POST /v1/files) gets 413, counted as it arrives, e.g. 1GiB (default: "
        "200MiB, OpenAI's)", parse=_bytes_of, check=positive, metavar="SIZE",
    )
    api_keys: tuple[str, ...] = setting(
        (), "clients must send `Authorization: Bearer KEY` on every route but /health (and /metrics); "
        "repeat for several keys; the variable takes them comma-separated (default: none, no auth)",
        flag="--api-key", is_repeated=True, check=_check_api_keys, group="operations", metavar="KEY",
    )
    allowed_origins: tuple[str, ...] = setting(
        (), "web pages of these origins (scheme://host[:port], comma-separated or several; *: any) may send "
        "what writes or costs compute; a browser request from another site's page gets 403 (default: this "
        "server's own pages only)", nargs="+", check=_check_origins, group="operations", metavar="ORIGIN",
    )
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
    stream_retention_s: float = setting(
        0.0, "keep each streamed answer's events this long after it ends, and let its request generate on "
        "as long without its client: a client that lost its connection resumes with Last-Event-ID at "
        "GET /v1/streams/{id}, or by sending the request again with the same X-Request-Id (0: off, a dropped "
        "client's request is aborted at once)", flag="--stream-retention", check=at_least(0), group="operations",
        metavar="SECONDS",
    )
    stream_retention_mib: int = setting(
        256, "most memory the kept streams take; past it those no client reads go, finished ones first",
        flag="--stream-retention-memory", check=at_least(1), group="operations", metavar="MiB",
    )
    max_header_bytes: int = setting(
        16 * 2**10, "a larger request head (request line and headers) gets 431", check=at_least(1024),
        group="operations", metavar="N",
    )
    responses_store: str = setting(
        "", "the SQLite file that keeps Responses (store: true) for previous_response_id, GET and background, "
        "and the Batch API's files and batches, across restarts; off: keep none (default: "
        "ZEROSERVE_CACHE/responses.sqlite)", group="operations",
        metavar="PATH",
    )
    store_owner: str = setting(
        "", "the name this server's files, batches and background responses carry in --responses-store: only "
        "their owner sees and runs the batches or fails the responses, so servers sharing one store never touch "
        "each other's (default: port PORT, the same again after a restart on that port)", group="operations",
        metavar="NAME",
    )
    store_max_bytes: int = setting(
        2**30, "most bytes --responses-store holds: files, batch results and kept Responses together; the oldest "
        "responses go first, an upload past it gets 400 store_full (default: 1GiB)", flag="--store-max-size",
        parse=_bytes_of, check=positive, group="operations", metavar="SIZE",
    )
    max_batch_lines: int | None = setting(
        None, "most Batch API lines in the engines at once; fewer leave interactive requests faster steps "
        "(default: 4 per engine, at most half of --max-num-seqs)", check=at_least(1), group="operations", metavar="N",
    )

    models_dir: str = setting(
        "", "serve every .gguf file and Hugging Face folder in this folder (and the models named), each under "
        "its file's or folder's name, loaded when a request first names it (default: none)", group="models",
        metavar="DIR",
    )
    models_config: str = setting(
        "", "a TOML or YAML file of per-model settings: each model's engine and parser settings, its path and its "
        "aliases (see the README's Many models section) (default: none)", group="models", metavar="PATH",
    )
    max_loaded_models: int | None = setting(
        None, "most models loaded at once; a request for another unloads the least recently used idle one "
        "(default: no limit but --memory-budget)", check=at_least(1), group="models", metavar="N",
    )
    memory_budget: int | None = setting(
        None, "most memory the loaded models' engines hold together, as each engine reports it (its peak resident "
        "memory on the CPU, device memory on a GPU), e.g. 16GiB; the least recently used idle model is unloaded "
        "to make room (default: no limit)", parse=_bytes_of, check=positive, group="models", metavar="SIZE",
    )
    idle_unload_s: float | None = setting(
        None, "unload a model no request has used for this long (default: never)",
        check=positive, group="models", metavar="SECONDS",
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if self.is_multi_model and (
            self.api_server_count > 1 or self.data_parallel_size < 1 or self.link.engine_address is not None
            or self.served_model_names
        ):
            raise ValueError(
                "several models (more than one MODEL, --models-dir or --models-config) are served by one gateway "
                "process with engines it starts: not with --api-server-count > 1, --data-parallel-size 0, "
                "--engine-address or --served-model-name (name models by aliases in --models-config)"
            )
        parsers = {self.tool_call_parser, self.reasoning_parser}
        if "harmony" in parsers and not parsers <= {"harmony", "auto", "none"}:
            raise ValueError(
                "harmony is one format for calls and reasoning: --tool-call-parser and --reasoning-parser "
                f"cannot take it with another ({self.tool_call_parser} and {self.reasoning_parser})"
            )
        if self.data_parallel_size == 0 and self.link.engine_address is None:
            raise ValueError("--data-parallel-size must be >= 1 (or 0 with --engine-address), got 0")
        if self.api_server_count > 1 and (
            self.data_parallel_size < 1 or self.link.engine_address is not None or self.link.is_curve
        ):
            raise ValueError(
                "--api-server-count > 1 shares the gateway's own engines (--data-parallel-size >= 1); "
                "it does not take --engine-address or CURVE keys"
            )

    @property
    def is_multi_model(self) -> bool:
        """Whether this gateway serves several models, each loaded on demand (service/models/)."""
        return len(self.models) > 1 or bool(self.models_dir) or bool(self.models_config)

    @property
    def responses_store_owner(self) -> str:
        """Who this server is in its store: --store-owner, else its port."""
        return self.store_owner or f"port {self.port}"

    @property
    def max_num_in_flight(self) -> int:
        """Generation requests one gateway process holds at once: its share (of --api-server-count)
        of the engines' batches plus the queue."""
        total = self.engine.max_num_seqs * max(self.data_parallel_size, 1) + self.max_num_queued_requests
        return -(-total // self.api_server_count)
