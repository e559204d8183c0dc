"""Prometheus metrics: vLLM v1's families (same names under the `zeroserve:` prefix, same types,
labels and buckets), kept per engine by a stat logger. Every family declared here has series;
those of features zeroserve has not (LoRA, KV transfer, multimodal caches, watermarking, NaN
checks, block residency sampling) are left out rather than declared empty. Beside them, the figures
the inference gateway's endpoint picker reads, under vLLM's own names, are picker_metrics.py's."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from proto.engine_output import FinishReason, SchedulerStats
from proto.handshake import EngineReady
from service.observability.stats import FinishedRequestStats, IterationStats

# NOTE: vLLM's buckets (vllm/v1/metrics/buckets.py), so dashboards and alerts carry over.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
REQUEST_PARAMS_N_BUCKETS = (1, 2, 5, 10, 20)
REQUEST_NUM_PREEMPTIONS_BUCKETS = (1, 2, 3, 4, 5, 10, 20)

LABELS = ("model_name", "engine")
WAITING_REASONS = ("capacity", "deferred")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
PROMPT_TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHE_HIT_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
ADMISSION_REASONS = ("max_num_queued_reqs", "max_num_queued_tokens")

# The families that show SchedulerStats' figures, by its field names: the gauges take the latest
# value, the counters grow by what the engine's totals added. The dashboard reads them back by these.
SCHEDULER_GAUGES: dict[str, tuple[str, str]] = {
    "num_running_reqs": ("num_requests_running", "Requests in the running batch."),
    "num_waiting_reqs": ("num_requests_waiting", "Requests waiting to be scheduled."),
    "kv_cache_usage": ("kv_cache_usage_perc", "KV cache usage; 1 means 100 percent."),
}
SCHEDULER_COUNTERS: dict[str, tuple[str, str]] = {
    "num_prefix_cache_queries": ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache."),
    "num_prefix_cache_hits": ("prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    "num_preemptions": ("num_preemptions", "Requests preempted by the scheduler."),
    "num_draft_tokens": ("spec_decode_num_draft_tokens", "Speculative decoding: draft tokens proposed."),
    "num_accepted_tokens": ("spec_decode_num_accepted_tokens", "Speculative decoding: draft tokens the model accepted."),
}


def cache_info(ready: EngineReady, enable_prefix_caching: bool) -> dict[str, str]:
    """cache_config_info's labels, as vLLM names its CacheConfig's fields."""
    return {
        "block_size": str(ready.block_size), "num_gpu_blocks": str(ready.num_kv_blocks),
        "enable_prefix_caching": str(enable_prefix_caching), "cache_dtype": "auto",
    }


def request_tokens_buckets(max_model_len: int) -> tuple[int, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to the context length."""
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


class _Families:
    """The metric families, registered in one registry."""

    def __init__(self, registry: CollectorRegistry | None, max_model_len: int, cache_info_labels: Sequence[str]) -> None:
        def gauge(name: str, documentation: str, labels: tuple[str, ...] = LABELS) -> Gauge:
            # NOTE: across gateway processes, the value most recently set by any of them.
            return Gauge(f"zeroserve:{name}", documentation, labels, registry=registry, multiprocess_mode="mostrecent")

        def counter(name: str, documentation: str, labels: tuple[str, ...] = LABELS) -> Counter:
            # NOTE: prometheus_client appends `_total` to a counter's name when it exposes it.
            return Counter(f"zeroserve:{name}", documentation, labels, registry=registry)

        def histogram(name: str, documentation: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(f"zeroserve:{name}", documentation, LABELS, buckets=buckets, registry=registry)

        tokens = request_tokens_buckets(max_model_len)
        # Scheduler state, caches, preemptions and drafts.
        self.scheduler_gauges = {field: gauge(*family) for field, family in SCHEDULER_GAUGES.items()}
        self.scheduler_counters = {field: counter(*family) for field, family in SCHEDULER_COUNTERS.items()}
        self.num_requests_waiting_by_reason = gauge(
            "num_requests_waiting_by_reason",
            "Waiting requests by reason: capacity (no room in the batch or the KV cache) or deferred.",
            (*LABELS, "reason"),
        )
        self.engine_sleep_state = gauge(
            "engine_sleep_state", "1 for the engine's sleep state: awake, weights_offloaded (level 1) or discard_all (level 2).",
            (*LABELS, "sleep_state"),
        )
        self.cache_config_info = gauge(
            "cache_config_info", "The engine's KV cache configuration (always 1).", (*cache_info_labels, "engine"),
        )
        # Tokens.
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens processed.")
        self.prompt_tokens_by_source = counter(
            "prompt_tokens_by_source", "Prompt tokens by source: computed, or found in the local prefix cache.",
            (*LABELS, "source"),
        )
        self.prompt_tokens_cached = counter("prompt_tokens_cached", "Prompt tokens found in a cache.")
        self.prompt_tokens_cached_by_source = counter(
            "prompt_tokens_cached_by_source", "Cached prompt tokens by the tier that held them (here: device).",
            (*LABELS, "source"),
        )
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        # Finished requests.
        self.request_success = counter(
            "request_success", "Finished requests, by finish reason.", (*LABELS, "finished_reason")
        )
        self.admission_rejections = counter(
            "admission_rejections", "Requests refused at admission (429), by the limit they hit.", ("model_name", "reason")
        )
        self.histograms = {
            key: histogram(name, documentation, tokens if buckets is None else buckets)
            for key, name, documentation, buckets in _HISTOGRAMS
        }


# The histograms: key, name, help and buckets (None: the token counts', up to max_model_len).
_HISTOGRAMS: tuple[tuple[str, str, str, Sequence[float] | None], ...] = (
    ("iteration_tokens", "iteration_tokens_total", "Tokens (prompt and generated) per batch of engine outputs.",
     ITERATION_TOKENS_BUCKETS),
    ("request_prompt_tokens", "request_prompt_tokens", "Prompt tokens per request.", None),
    ("request_generation_tokens", "request_generation_tokens", "Generated tokens per request.", None),
    ("request_max_num_generation_tokens", "request_max_num_generation_tokens",
     "The most tokens any sample of a request generated.", None),
    ("request_params_n", "request_params_n", "The n parameter of requests.", REQUEST_PARAMS_N_BUCKETS),
    ("request_params_max_tokens", "request_params_max_tokens", "The max_tokens parameter of requests.", None),
    ("request_prefill_kv_computed_tokens", "request_prefill_kv_computed_tokens",
     "Prompt tokens a request computed (not found in the prefix cache).", None),
    ("request_num_preemptions", "request_num_preemptions", "Times a request was preempted.", REQUEST_NUM_PREEMPTIONS_BUCKETS),
    ("time_to_first_token", "time_to_first_token_seconds", "Time to first token, from arrival.", TTFT_BUCKETS),
    ("inter_token_latency", "inter_token_latency_seconds", "Time between a request's consecutive tokens.", ITL_BUCKETS),
    ("request_time_per_output_token", "request_time_per_output_token_seconds",
     "A request's decode time per token after its first.", ITL_BUCKETS),
    ("e2e_request_latency", "e2e_request_latency_seconds", "Time from arrival to finish.", REQUEST_LATENCY_BUCKETS),
    ("request_queue_time", "request_queue_time_seconds", "Time in the engine's waiting queue before first scheduled.",
     REQUEST_LATENCY_BUCKETS),
    ("request_inference_time", "request_inference_time_seconds", "Time from first scheduled to the last token.",
     REQUEST_LATENCY_BUCKETS),
    ("request_prefill_time", "request_prefill_time_seconds", "Time from first scheduled to the first token.",
     REQUEST_LATENCY_BUCKETS),
    ("request_decode_time", "request_decode_time_seconds", "Time from the first token to the last.", REQUEST_LATENCY_BUCKETS),
)


class _EngineMetrics:
    """One engine's labelled children (every label value vLLM creates up front), and the engine
    totals already counted."""

    def __init__(self, families: _Families, model_name: str, engine: str, cache_info: Mapping[str, str]) -> None:
        labels = {"model_name": model_name, "engine": engine}
        self.labels = labels
        self.families = families
        self.scheduler_gauges = {field: family.labels(**labels) for field, family in families.scheduler_gauges.items()}
        self.scheduler_counters = {field: family.labels(**labels) for field, family in families.scheduler_counters.items()}
        self.waiting_by_reason = {r: families.num_requests_waiting_by_reason.labels(**labels, reason=r) for r in WAITING_REASONS}
        self.sleep_states = {s: families.engine_sleep_state.labels(**labels, sleep_state=s) for s in SLEEP_STATES}
        self.sleep_states["awake"].set(1)
        families.cache_config_info.labels(**cache_info, engine=engine).set(1)
        self.prompt_tokens = families.prompt_tokens.labels(**labels)
        self.prompt_tokens_by_source = {s: families.prompt_tokens_by_source.labels(**labels, source=s) for s in PROMPT_TOKEN_SOURCES}
        self.prompt_tokens_cached = families.prompt_tokens_cached.labels(**labels)
        self.prompt_tokens_cached_by_source = {
            s: families.prompt_tokens_cached_by_source.labels(**labels, source=s) for s in CACHE_HIT_SOURCES
        }
        self.generation_tokens = families.generation_tokens.labels(**labels)
        self.request_success = {str(r): families.request_success.labels(**labels, finished_reason=str(r)) for r in FinishReason}
        self.histograms = {key: family.labels(**labels) for key, family in families.histograms.items()}
        self.counted = SchedulerStats()

    def observe(self, name: str, value: float) -> None:
        self.histograms[name].observe(value)


class PrometheusStatLogger:
    """Feeds engine statistics into its own registry (so several servers in one process never clash).

    The series of `engine_indexes` exist from the start, at zero, so the first increments are not
    lost to `rate()`; other engines' appear with their first statistics.

    One of several gateway processes (`api_server_index` set) keeps its values in prometheus_client's
    files under PROMETHEUS_MULTIPROC_DIR (set by whoever started the processes, before they import
    prometheus_client), and its registry reads every process's files, so a scrape of any process
    sees the sum. Every process sees the same engine totals, so only process 0 counts them.

    `max_model_len` caps the token-count buckets, as vLLM's; `cache_info` labels cache_config_info."""

    def __init__(
        self,
        model_name: str,
        engine_indexes: Sequence[int] = (0,),
        api_server_index: int | None = None,
        max_model_len: int = 2048,
        cache_info: Mapping[str, str] | None = None,
    ) -> None:
        self.model_name = model_name
        self.cache_info = dict(cache_info or {})
        self.registry = CollectorRegistry()
        if api_server_index is None:
            # NOTE: where families are declared: this registry, or (None) prometheus_client's files,
            # which the MultiProcessCollector reads back; other loggers' families go there too.
            self.families_registry: CollectorRegistry | None = self.registry
        else:
            # NOTE: raises when PROMETHEUS_MULTIPROC_DIR is unset.
            MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]
            self.families_registry = None
        self._families = _Families(self.families_registry, max_model_len, tuple(self.cache_info))
        self.counts_engine_totals = api_server_index in (None, 0)
        self._engines: dict[int, _EngineMetrics] = {}
        self._admission_rejections = {
            reason: self._families.admission_rejections.labels(model_name=model_name, reason=reason)
            for reason in ADMISSION_REASONS
        }
        for engine_index in engine_indexes:
            self._engine(engine_index)

    def record(
        self, engine_index: int, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        metrics = self._engine(engine_index)
        if scheduler_stats is not None:
            _record_scheduler_stats(metrics, scheduler_stats, self.counts_engine_totals)
        if iteration_stats is not None:
            _record_iteration_stats(metrics, iteration_stats)

    def record_admission_rejection(self, reason: str = "max_num_queued_reqs") -> None:
        self._admission_rejections[reason].inc()

    def record_sleep_state(self, level: int) -> None:
        """0: awake; 1: weights offloaded (KV cache freed); 2: everything discarded."""
        for metrics in self._engines.values():
            for index, state in enumerate(SLEEP_STATES):
                metrics.sleep_states[state].set(1 if index == level else 0)

    def log(self) -> None:
        """Nothing to do: Prometheus scrapes the registry."""

    def keep_engines(self, engine_indices: Collection[int]) -> None:
        """An engine gone runs and holds nothing: its gauges go to 0 (its counters stay)."""
        for engine_index in set(self._engines) - set(engine_indices):
            metrics = self._engines.pop(engine_index)
            for gauge in (*metrics.scheduler_gauges.values(), *metrics.waiting_by_reason.values()):
                gauge.set(0)

    def _engine(self, engine_index: int) -> _EngineMetrics:
        metrics = self._engines.get(engine_index)
        if metrics is None:
            metrics = self._engines[engine_index] = _EngineMetrics(
                self._families, self.model_name, str(engine_index), self.cache_info
            )
        return metrics


def _record_scheduler_stats(metrics: _EngineMetrics, stats: SchedulerStats, counts_engine_totals: bool) -> None:
    for field, gauge in metrics.scheduler_gauges.items():
        gauge.set(getattr(stats, field))
    # NOTE: every waiting request here waits for room (nothing defers one, as LoRA or KV transfer would).
    metrics.waiting_by_reason["capacity"].set(stats.num_waiting_reqs)
    if not counts_engine_totals:
        return
    # NOTE: the totals grow monotonically, so the delta since this process last saw them is exact
    # however many steps it did not see.
    for field, counter in metrics.scheduler_counters.items():
        counter.inc(_delta(getattr(stats, field), getattr(metrics.counted, field)))
    metrics.counted = stats


def _record_iteration_stats(metrics: _EngineMetrics, stats: IterationStats) -> None:
    cached = stats.num_cached_prompt_tokens
    metrics.prompt_tokens.inc(stats.num_prompt_tokens)
    metrics.prompt_tokens_by_source["local_compute"].inc(stats.num_prompt_tokens - cached)
    metrics.prompt_tokens_by_source["local_cache_hit"].inc(cached)
    metrics.prompt_tokens_cached.inc(cached)
    metrics.prompt_tokens_cached_by_source["device"].inc(cached)
    metrics.generation_tokens.inc(stats.num_generation_tokens)
    if stats.num_prompt_tokens or stats.num_generation_tokens:
        metrics.observe("iteration_tokens", stats.num_prompt_tokens + stats.num_generation_tokens)
    for ttft in stats.time_to_first_tokens:
        metrics.observe("time_to_first_token", ttft)
    for latency in stats.inter_token_latencies:
        metrics.observe("inter_token_latency", latency)
    for finished in stats.finished_requests:
        _record_finished(metrics, finished)


def _record_finished(metrics: _EngineMetrics, finished: FinishedRequestStats) -> None:
    metrics.request_success[finished.finish_reason].inc()
    for name, value in (
        ("e2e_request_latency", finished.e2e_latency), ("request_queue_time", finished.queued_time),
        ("request_inference_time", finished.inference_time), ("request_prefill_time", finished.prefill_time),
        ("request_decode_time", finished.decode_time), ("request_prompt_tokens", finished.num_prompt_tokens),
        ("request_generation_tokens", finished.num_generation_tokens),
        ("request_prefill_kv_computed_tokens", finished.num_prompt_tokens - finished.num_cached_tokens),
        ("request_num_preemptions", finished.num_preemptions),
    ):
        metrics.observe(name, value)
    if finished.num_generation_tokens > 1:
        metrics.observe("request_time_per_output_token", finished.decode_time / (finished.num_generation_tokens - 1))
    if finished.n:
        # NOTE: once per prompt, as vLLM counts a parent request (its other samples have n 0); for
        # n > 1 the most tokens is its first sample's, not yet the most over all its samples.
        metrics.observe("request_params_n", finished.n)
        metrics.observe("request_params_max_tokens", finished.max_tokens)
        metrics.observe("request_max_num_generation_tokens", finished.num_generation_tokens)


def _delta(total: int, counted: int) -> int:
    """What an engine total added since last counted; a total that went down means the engine
    restarted, so all of it is new."""
    return total - counted if total >= counted else total
