"""One gateway process's parts wired together, the same way for `zeroserve serve` and for the tests:
the app with its admission and kept streams at once, then, once an engine client is ready, the state
every route reads (metrics, the request log, the dashboard's recent requests, the body preparer)."""

from __future__ import annotations

from collections.abc import Mapping

from proto.handshake import EngineReady
from service.api.admission import Admission
from service.api.app import attach, attach_pool, create_app
from service.api.gateway_state import ServerPool, ServerState, gateway_of
from service.api.routes import batch_endpoints
from service.client.core_client import EngineCoreClient
from service.config import GatewayConfig, origins_of
from service.frontend.async_llm import AsyncLLM
from service.model_files.tokenizer import Tokenizer
from service.models.catalog import ModelEntry
from service.observability.dashboard import RecentRequests
from service.observability.metrics import PrometheusStatLogger, cache_info
from service.observability.picker_metrics import PickerMetrics
from service.observability.request_log import RequestLogger
from service.observability.stat_loggers import StatLogger
from service.openai.answer import resolve_parsers
from service.openai.batch_store import BatchStore
from service.openai.batch_worker import BatchWorker, fixed_state
from service.openai.prepare import Preparer
from service.openai.response_store import open_store, store_path
from service.streams.stream_store import StreamStore

# NOTE: a step of many sequences takes longer than a step of one on a CPU, and an interactive request
# shares the batch's steps: with 4 lines an interactive time to first token stayed within 1.5x of an idle
# server's, with 8 it did not (benchmarks/batch_ttft.py; figures in the README's Batch API section).
DEFAULT_BATCH_LINES_PER_ENGINE = 4


class Gateway:
    """The app `zeroserve serve` runs: 503 "loading" until `serve_with` hands it a ready engine client."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.admission = Admission(config.max_num_in_flight, config.request_timeout_s, config.max_header_bytes)
        self.streams = StreamStore(config.stream_retention_s, config.stream_retention_mib * 2**20)
        self.app = create_app(
            None, config.api_keys, config.is_metrics_auth, config.sse_keepalive_s, self.admission, self.streams,
            origins_of(config.allowed_origins),
        )
        gateway = gateway_of(self.app)
        gateway.max_upload_bytes = config.max_upload_bytes
        # NOTE: the Batch API's files and batches (service/api/batches.py), kept beside the Responses (none with
        # --responses-store off); the worker that runs them starts with the engine.
        path, owner = store_path(config.responses_store), config.responses_store_owner
        self.batches = None if path is None else BatchWorker(
            BatchStore(path, owner, config.store_max_bytes), batch_endpoints(), _max_batch_lines(config),
            config.request_timeout_s,
        )
        gateway.batches = self.batches
        # NOTE: kept Responses (service/api/responses.py reads it); opened here so a bad path fails at start.
        gateway.response_store = open_store(config.responses_store, owner, config.store_max_bytes)

    def serve_with(
        self,
        engine_client: EngineCoreClient,
        tokenizer: Tokenizer,
        ready: EngineReady,
        model_name: str,
        model_generation_defaults: Mapping[str, float] | None = None,
        stats_log_interval_s: float | None = None,
    ) -> AsyncLLM:
        """Serves the model (named `model_name` unless --served-model-name names it) on `engine_client`
        from now on; its sampling defaults are the model's under --override-generation-config."""
        config = self.config
        names = list(config.served_model_names or (model_name,))
        state, metrics = self._model_state(
            config, engine_client, tokenizer, ready, names, model_generation_defaults, stats_log_interval_s
        )
        self.admission.on_rejection = metrics.record_admission_rejection
        attach(self.app, state)
        # NOTE: one gateway process runs the kept batches (every one answers their routes).
        if self.batches is not None and config.api_server_index in (None, 0):
            self.batches.start(fixed_state(state))
        return state.llm

    def serve_models(self, pool: ServerPool) -> None:
        """Serves the pool's models from now on, each loaded when a request names it."""
        gateway_of(self.app).pool = pool
        attach_pool(self.app)
        if self.batches is not None:
            self.batches.start(pool.lease)

    def model_state(self, entry: ModelEntry, engine_client: EngineCoreClient, tokenizer: Tokenizer, ready: EngineReady) -> ServerState:
        """The routes' state of one model of a multi-model gateway, under its id and aliases."""
        state, _ = self._model_state(
            entry.config, engine_client, tokenizer, ready, list(entry.names), entry.generation_defaults, None
        )
        return state

    def _model_state(
        self,
        config: GatewayConfig,
        engine_client: EngineCoreClient,
        tokenizer: Tokenizer,
        ready: EngineReady,
        names: list[str],
        model_generation_defaults: Mapping[str, float] | None,
        stats_log_interval_s: float | None,
    ) -> tuple[ServerState, PrometheusStatLogger]:
        engine_indexes = range(max(config.data_parallel_size, 1))
        metrics = PrometheusStatLogger(
            names[0], engine_indexes, config.api_server_index, ready.max_model_len,
            cache_info(ready, config.engine.enable_prefix_caching),
        )
        recent_requests = RecentRequests()
        stat_loggers: list[StatLogger] = [
            metrics, PickerMetrics(metrics, engine_indexes), RequestLogger(), recent_requests
        ]
        llm = AsyncLLM(
            engine_client, tokenizer, ready, stat_loggers=stat_loggers,
            stats_log_interval_s=stats_log_interval_s,
        )
        generation_defaults = {**(model_generation_defaults or {}), **dict(config.generation_config)}
        tool_call_parser, reasoning_parser = resolve_parsers(
            config.tool_call_parser, config.reasoning_parser, tokenizer.chat_template
        )
        preparer = Preparer(
            llm.input_processor, names, generation_defaults, config.max_n, reasoning_parser,
            is_serving_rank=engine_client.is_serving_rank, is_generating=ready.runner != "pooling",
        )
        state = ServerState(
            llm, preparer, gateway_of(self.app), config.max_request_body_bytes, metrics_registry=metrics.registry,
            tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser,
            recent_requests=recent_requests,
        )
        return state, metrics


def _max_batch_lines(config: GatewayConfig) -> int:
    """Batch lines in the engines at once: --max-batch-lines, by default DEFAULT_BATCH_LINES_PER_ENGINE
    per engine (never more than half their seats, so interactive requests always find one)."""
    if config.max_batch_lines is not None:
        return config.max_batch_lines
    num_engines = max(config.data_parallel_size, 1)
    return max(1, min(DEFAULT_BATCH_LINES_PER_ENGINE, config.engine.max_num_seqs // 2) * num_engines)

