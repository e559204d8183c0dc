"""Where engine statistics go: the periodic log line, and any other logger (Prometheus)."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence
from typing import Protocol

from proto.engine_output import SchedulerStats
from service.observability.stats import IterationStats

logger = logging.getLogger("zeroserve.stats")

DEFAULT_STATS_LOG_INTERVAL_S = 10.0


class StatLogger(Protocol):
    """Receives every batch's statistics; `log()` runs periodically."""

    def record(
        self, engine_index: int, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None: ...

    def log(self) -> None: ...

    def keep_engines(self, engine_indices: Collection[int]) -> None:
        """Forgets the engines not in `engine_indices` (they left or were lost)."""


class _EngineTotals:
    """What one engine did since the last log line."""

    def __init__(self) -> None:
        self.num_prompt_tokens = 0
        self.num_generation_tokens = 0
        self.last_stats = SchedulerStats()
        self.logged_stats = SchedulerStats()


class LoggingStatLogger:
    """Logs a line per engine every interval: throughput, queue, KV cache, prefix hits,
    preemptions; silent while the engine is idle."""

    def __init__(self, interval_s: float = DEFAULT_STATS_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.engines: dict[int, _EngineTotals] = {}
        self.last_log_time = time.monotonic()

    def record(
        self, engine_index: int, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        totals = self.engines.get(engine_index)
        if totals is None:
            totals = self.engines[engine_index] = _EngineTotals()
        if scheduler_stats is not None:
            totals.last_stats = scheduler_stats
        if iteration_stats is not None:
            totals.num_prompt_tokens += iteration_stats.num_prompt_tokens
            totals.num_generation_tokens += iteration_stats.num_generation_tokens

    def keep_engines(self, engine_indices: Collection[int]) -> None:
        for engine_index in set(self.engines) - set(engine_indices):
            del self.engines[engine_index]

    def maybe_log(self) -> None:
        """Logs if an interval has passed since the last line (for callers without a timer)."""
        if time.monotonic() - self.last_log_time >= self.interval_s:
            self.log()

    def log(self) -> None:
        now = time.monotonic()
        elapsed = max(now - self.last_log_time, 1e-9)
        self.last_log_time = now
        for engine_index, totals in sorted(self.engines.items()):
            line = self._line(engine_index, totals, elapsed)
            if line is not None:
                logger.info(line)
            totals.num_prompt_tokens = totals.num_generation_tokens = 0
            totals.logged_stats = totals.last_stats

    @staticmethod
    def _line(engine_index: int, totals: _EngineTotals, elapsed: float) -> str | None:
        stats, before = totals.last_stats, totals.logged_stats
        is_idle = not (
            totals.num_prompt_tokens or totals.num_generation_tokens
            or stats.num_running_reqs or stats.num_waiting_reqs
        )
        if is_idle:
            return None
        num_queries = stats.num_prefix_cache_queries - before.num_prefix_cache_queries
        num_hits = stats.num_prefix_cache_hits - before.num_prefix_cache_hits
        hit_rate = num_hits / num_queries if num_queries > 0 else 0.0
        num_drafts = stats.num_draft_tokens - before.num_draft_tokens
        num_accepted = stats.num_accepted_tokens - before.num_accepted_tokens
        drafts = f", Draft acceptance rate: {num_accepted / num_drafts:.1%}" if num_drafts > 0 else ""
        return (
            f"Engine {engine_index:03d}: "
            f"Avg prompt throughput: {totals.num_prompt_tokens / elapsed:.1f} tokens/s, "
            f"Avg generation throughput: {totals.num_generation_tokens / elapsed:.1f} tokens/s, "
            f"Running: {stats.num_running_reqs} reqs, Waiting: {stats.num_waiting_reqs} reqs, "
            f"KV cache usage: {stats.kv_cache_usage:.1%}, "
            f"Prefix cache hit rate: {hit_rate:.1%}, "
            f"Preemptions: {max(0, stats.num_preemptions - before.num_preemptions)}{drafts}"
        )


class StatLoggerManager:
    """Fans each record out to every logger."""

    def __init__(self, loggers: Sequence[StatLogger]) -> None:
        self.loggers = list(loggers)

    def record(
        self, engine_index: int, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        for stat_logger in self.loggers:
            stat_logger.record(engine_index, scheduler_stats, iteration_stats)

    def log(self) -> None:
        for stat_logger in self.loggers:
            stat_logger.log()

    def keep_engines(self, engine_indices: Collection[int]) -> None:
        for stat_logger in self.loggers:
            stat_logger.keep_engines(engine_indices)

    def record_sleep_state(self, level: int) -> None:
        """0 awake, else the sleep level, for the loggers that show it (the metrics)."""
        for stat_logger in self.loggers:
            record = getattr(stat_logger, "record_sleep_state", None)
            if record is not None:
                record(level)
