"""Prometheus metrics: a stat logger that keeps gauges, counters and histograms per engine."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from proto.engine_output import FinishReason, SchedulerStats
from service.observability.stats import IterationStats

# NOTE: the same buckets as vLLM's, so dashboards and alerts carry over.
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

LABELS = ("model_name", "engine")


class _EngineMetrics:
    """One engine's labelled children (one per finish reason too), and the engine totals already counted."""

    def __init__(self, families: _Families, model_name: str, engine: str) -> None:
        labels = {"model_name": model_name, "engine": engine}
        self.num_requests_running = families.num_requests_running.labels(**labels)
        self.num_requests_waiting = families.num_requests_waiting.labels(**labels)
        self.kv_cache_usage = families.kv_cache_usage.labels(**labels)
        self.prefix_cache_queries = families.prefix_cache_queries.labels(**labels)
        self.prefix_cache_hits = families.prefix_cache_hits.labels(**labels)
        self.num_preemptions = families.num_preemptions.labels(**labels)
        self.spec_decode_draft_tokens = families.spec_decode_draft_tokens.labels(**labels)
        self.spec_decode_accepted_tokens = families.spec_decode_accepted_tokens.labels(**labels)
        self.prompt_tokens = families.prompt_tokens.labels(**labels)
        self.generation_tokens = families.generation_tokens.labels(**labels)
        self.time_to_first_token = families.time_to_first_token.labels(**labels)
        self.inter_token_latency = families.inter_token_latency.labels(**labels)
        self.e2e_request_latency = families.e2e_request_latency.labels(**labels)
        self.request_queue_time = families.request_queue_time.labels(**labels)
        self.request_success = families.request_success
        for reason in FinishReason:
            self.request_success.labels(**labels, finished_reason=str(reason))
        self.labels = labels
        self.counted = SchedulerStats()


class _Families:
    """The metric families, registered in one registry."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        def gauge(name: str, documentation: str) -> Gauge:
            # NOTE: across gateway processes, the value most recently set by any of them.
            return Gauge(name, documentation, LABELS, registry=registry, multiprocess_mode="mostrecent")

        def counter(name: str, documentation: str, extra: tuple[str, ...] = ()) -> Counter:
            # NOTE: prometheus_client appends `_total` to a counter's name when it exposes it.
            return Counter(name, documentation, LABELS + extra, registry=registry)

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, documentation, LABELS, buckets=buckets, registry=registry)

        self.num_requests_running = gauge("zeroserve:num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = gauge("zeroserve:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = gauge("zeroserve:kv_cache_usage_perc", "KV cache usage; 1 means 100 percent.")
        self.prefix_cache_queries = counter(
            "zeroserve:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = counter("zeroserve:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.num_preemptions = counter("zeroserve:num_preemptions", "Requests preempted by the scheduler.")
        self.spec_decode_draft_tokens = counter(
            "zeroserve:spec_decode_num_draft_tokens", "Speculative decoding: draft tokens proposed."
        )
        self.spec_decode_accepted_tokens = counter(
            "zeroserve:spec_decode_num_accepted_tokens", "Speculative decoding: draft tokens the model accepted."
        )
        self.prompt_tokens = counter("zeroserve:prompt_tokens", "Prompt tokens processed.")
        self.generation_tokens = counter("zeroserve:generation_tokens", "Tokens generated.")
        self.request_success = counter(
            "zeroserve:request_success", "Finished requests, by finish reason.", ("finished_reason",)
        )
        self.time_to_first_token = histogram(
            "zeroserve:time_to_first_token_seconds", "Time to first token, from arrival.", TTFT_BUCKETS
        )
        self.inter_token_latency = histogram(
            "zeroserve:inter_token_latency_seconds", "Time between a request's consecutive tokens.", ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "zeroserve:e2e_request_latency_seconds", "Time from arrival to finish.", REQUEST_LATENCY_BUCKETS
        )
        self.request_queue_time = histogram(
            "zeroserve:request_queue_time_seconds", "Time in the engine's waiting queue before first scheduled.",
            REQUEST_LATENCY_BUCKETS,
        )


class PrometheusStatLogger:
    """Feeds engine statistics into its own registry (so several servers in one process never clash).

    The series of `engine_indexes` exist from the start, at zero, so the first increments are not
    lost to `rate()`; other engines' appear with their first statistics.

    One of several gateway processes (`api_server_index` set) keeps its values in prometheus_client's
    files under PROMETHEUS_MULTIPROC_DIR (set by whoever started the processes, before they import
    prometheus_client), and its registry reads every process's files, so a scrape of any process
    sees the sum. Every process sees the same engine totals, so only process 0 counts them."""

    def __init__(
        self, model_name: str, engine_indexes: Sequence[int] = (0,), api_server_index: int | None = None
    ) -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry()
        if api_server_index is None:
            self._families = _Families(self.registry)
        else:
            # NOTE: raises when PROMETHEUS_MULTIPROC_DIR is unset.
            MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]
            self._families = _Families(None)
        self.counts_engine_totals = api_server_index in (None, 0)
        self._engines: dict[int, _EngineMetrics] = {}
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

    def log(self) -> None:
        """Nothing to do: Prometheus scrapes the registry."""

    def keep_engines(self, engine_indices: Collection[int]) -> None:
        """An engine gone runs and holds nothing: its gauges go to 0 (its counters stay)."""
        for engine_index in set(self._engines) - set(engine_indices):
            metrics = self._engines.pop(engine_index)
            for gauge in (metrics.num_requests_running, metrics.num_requests_waiting, metrics.kv_cache_usage):
                gauge.set(0)

    def _engine(self, engine_index: int) -> _EngineMetrics:
        metrics = self._engines.get(engine_index)
        if metrics is None:
            metrics = self._engines[engine_index] = _EngineMetrics(self._families, self.model_name, str(engine_index))
        return metrics


def _record_scheduler_stats(metrics: _EngineMetrics, stats: SchedulerStats, counts_engine_totals: bool) -> None:
    metrics.num_requests_running.set(stats.num_running_reqs)
    metrics.num_requests_waiting.set(stats.num_waiting_reqs)
    metrics.kv_cache_usage.set(stats.kv_cache_usage)
    if not counts_engine_totals:
        return
    # NOTE: the totals grow monotonically, so the delta since this process last saw them is exact
    # however many steps it did not see.
    counted = metrics.counted
    metrics.prefix_cache_queries.inc(_delta(stats.num_prefix_cache_queries, counted.num_prefix_cache_queries))
    metrics.prefix_cache_hits.inc(_delta(stats.num_prefix_cache_hits, counted.num_prefix_cache_hits))
    metrics.num_preemptions.inc(_delta(stats.num_preemptions, counted.num_preemptions))
    metrics.spec_decode_draft_tokens.inc(_delta(stats.num_draft_tokens, counted.num_draft_tokens))
    metrics.spec_decode_accepted_tokens.inc(_delta(stats.num_accepted_tokens, counted.num_accepted_tokens))
    metrics.counted = stats


def _record_iteration_stats(metrics: _EngineMetrics, stats: IterationStats) -> None:
    metrics.prompt_tokens.inc(stats.num_prompt_tokens)
    metrics.generation_tokens.inc(stats.num_generation_tokens)
    for ttft in stats.time_to_first_tokens:
        metrics.time_to_first_token.observe(ttft)
    for latency in stats.inter_token_latencies:
        metrics.inter_token_latency.observe(latency)
    for finished in stats.finished_requests:
        metrics.request_success.labels(**metrics.labels, finished_reason=finished.finish_reason).inc()
        metrics.e2e_request_latency.observe(finished.e2e_latency)
        metrics.request_queue_time.observe(finished.queued_time)


def _delta(total: int, counted: int) -> int:
    """What an engine total added since last counted; a total that went down means the engine
    restarted, so all of it is new."""
    return total - counted if total >= counted else total
