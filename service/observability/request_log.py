"""One log line per finished request: a stat logger fed by the finished requests' figures."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection

from proto.engine_output import SchedulerStats
from service.observability.stats import IterationStats

logger = logging.getLogger("zeroserve.request")


class RequestLogger:
    """Logs each finished request at info level; its figures also ride on the record as fields
    (`request_id`, `num_prompt_tokens`, `ttft`, ...), which the JSON log format turns into keys."""

    def record(
        self, engine_index: int, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None
    ) -> None:
        if iteration_stats is None or not logger.isEnabledFor(logging.INFO):
            return
        for finished in iteration_stats.finished_requests:
            logger.info(
                "request %s finished (%s): %d prompt tokens, %d output tokens, TTFT %.3fs, total %.3fs",
                finished.request_id, finished.finish_reason, finished.num_prompt_tokens,
                finished.num_generation_tokens, finished.ttft, finished.e2e_latency,
                extra={**dataclasses.asdict(finished), "engine_index": engine_index},
            )

    def log(self) -> None:
        """Nothing to do: lines go out as requests finish."""

    def keep_engines(self, engine_indices: Collection[int]) -> None:
        """Nothing kept per engine."""
