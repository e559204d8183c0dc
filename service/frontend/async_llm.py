"""AsyncLLM: the gateway's asyncio engine client, one collector per request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import numpy as np

from proto import envs
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest
from proto.engine_output import SchedulerStats
from proto.handshake import EngineReady
from service.client.core_client import EngineCoreClient, EngineDeadError
from service.client.engine_state import EngineLost
from service.client.make_client import make_client
from service.frontend.input_processor import InputProcessor
from service.frontend.output_processor import OutputProcessor, RequestOutputCollector, RequestState
from service.frontend.outputs import RequestOutput
from service.frontend.sampling_params import SamplingParams
from service.model_files.tokenizer import Tokenizer
from service.observability.stat_loggers import LoggingStatLogger, StatLogger, StatLoggerManager
from service.observability.stats import IterationStats

logger = logging.getLogger(__name__)


_KEEP_ENGINES_S = 5.0


class EngineRequestError(ValueError):
    """The engine could not run a request (its message says why): the request's fault, not the engine's."""


class EngineSleepingError(RuntimeError):
    """The engine is asleep (its KV cache, maybe its weights, freed) until woken up."""


class AsyncLLM:
    """Sends requests to the engine and streams their outputs back through collectors."""

    def __init__(
        self,
        engine_client: EngineCoreClient,
        tokenizer: Tokenizer,
        ready: EngineReady,
        stat_loggers: Sequence[StatLogger] = (),
        stats_log_interval_s: float | None = None,
    ) -> None:
        self.engine_client = engine_client
        self.tokenizer = tokenizer
        self.ready = ready
        self.model_name = ready.model_name
        self.input_processor = InputProcessor(
            tokenizer, ready.max_model_len, ready.vocab_size, ready.structured_output_backend
        )
        self.output_processor = OutputProcessor(tokenizer)
        interval = envs.stats_log_interval() if stats_log_interval_s is None else stats_log_interval_s
        loggers = list(stat_loggers) + ([LoggingStatLogger(interval)] if interval > 0 else [])
        self.stat_loggers = StatLoggerManager(loggers) if loggers else None
        self.is_sleeping = False
        self._tasks = [asyncio.create_task(self._run_output_handler(), name="output-handler")]
        if self.stat_loggers is not None:
            # NOTE: without a log line, still this often to forget engines that are gone.
            period = interval if interval > 0 else _KEEP_ENGINES_S
            self._tasks.append(asyncio.create_task(self._run_stats_log(period), name="stats-log"))

    @classmethod
    async def start(cls, engine_config: EngineConfig, tokenizer: Tokenizer, **kwargs: Any) -> AsyncLLM:
        """Starts the engine process and waits until it is ready."""
        client = make_client(engine_config, multiprocess_mode=True, asyncio_mode=True)
        try:
            ready = await client.wait_ready()
        except BaseException:
            client.shutdown()
            raise
        return cls(client, tokenizer, ready, **kwargs)

    @property
    def is_dead(self) -> bool:
        return self.engine_client.is_dead

    async def generate(
        self, requests: Sequence[EngineCoreRequest], params: SamplingParams, prompt: str | None = None
    ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """Yields (position in `requests`, output delta) as the samples (InputProcessor.process's
        requests, of one prompt or several) produce them, through one collector; closing it or
        cancelling its consumer aborts the unfinished ones in the engine."""
        if self.is_dead:
            raise EngineDeadError("engine is dead")
        if self.is_sleeping:
            raise EngineSleepingError("the engine is asleep; wake it up before sending requests")
        collector = RequestOutputCollector()
        unfinished = {request.request_id for request in requests}
        try:
            for index, request in enumerate(requests):
                self.output_processor.add_request(request, params, prompt, collector, index)
                await self.engine_client.add_request_async(request)
            while unfinished:
                for index, output in collector.get_nowait() or await collector.get():
                    if output.finished:
                        unfinished.discard(requests[index].request_id)
                    yield index, output
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(list(unfinished))
            raise
        except BaseException:
            # NOTE: the engine failed or is gone: nothing to tell it, only our states to drop.
            self.output_processor.abort_requests(list(unfinished))
            raise

    async def encode(self, requests: Sequence[EngineCoreRequest]) -> list[np.ndarray]:
        """Each pooling request's answer (its embedding, or its pair's scores), in order; a request the
        engine could not run is an EngineRequestError saying why."""
        pooled: list[np.ndarray | None] = [None] * len(requests)
        async for index, output in self.generate(requests, SamplingParams()):
            completion = output.outputs[0] if output.outputs else None
            if completion is not None and completion.finish_reason == "error":
                raise EngineRequestError(str(completion.stop_reason))
            if output.pooled is not None:
                pooled[index] = output.pooled
        missing = [requests[index].request_id for index, vector in enumerate(pooled) if vector is None]
        if missing:
            raise EngineRequestError(f"the engine answered {missing[0]} without a vector")
        return [vector for vector in pooled if vector is not None]

    async def abort(self, request_ids: list[str]) -> None:
        """Ends the requests (a client gone, a drain given up) in the engine, and records each as
        finished with reason "abort" (a request log line, the metrics' count)."""
        request_ids = [r for r in request_ids if r in self.output_processor.request_states]
        if request_ids:
            aborted = self.output_processor.abort_requests(request_ids)
            await self.engine_client.abort_requests_async(request_ids)
            if self.stat_loggers is not None:
                self._record_aborted(aborted)

    def _record_aborted(self, states: list[RequestState]) -> None:
        assert self.stat_loggers is not None
        by_engine: dict[int, IterationStats] = {}
        for state in states:
            stats = by_engine.setdefault(state.engine_index, IterationStats(state.engine_index))
            stats.update_from_finished_request(
                state.request_id, "abort", len(state.prompt_token_ids), state.num_cached_tokens, state.stats
            )
        for engine_index, stats in by_engine.items():
            self.stat_loggers.record(engine_index, None, stats)

    async def reset_prefix_cache(self) -> bool:
        return await self.engine_client.reset_prefix_cache_async()

    async def sleep(self, level: int = 1) -> None:
        """Frees the KV cache (level 1) and the weights (level 2); requests are refused until
        `wake_up()`."""
        await self.engine_client.sleep_async(level)
        self.is_sleeping = True
        if self.stat_loggers is not None:
            self.stat_loggers.record_sleep_state(level)

    async def wake_up(self) -> None:
        await self.engine_client.wake_up_async()
        self.is_sleeping = False
        if self.stat_loggers is not None:
            self.stat_loggers.record_sleep_state(0)

    async def get_stats(self) -> SchedulerStats:
        """The first engine's state now: requests running and waiting, KV cache, prefix cache, drafts."""
        return await self.engine_client.get_stats_async()

    async def _run_output_handler(self) -> None:
        """The one task that moves engine outputs to the requests' collectors."""
        try:
            while True:
                outputs = await self.engine_client.get_output_async()
                if isinstance(outputs, EngineLost):
                    await self._resume(outputs)
                    continue
                iteration_stats = None if self.stat_loggers is None else IterationStats(outputs.engine_index)
                processed = self.output_processor.process_outputs(
                    outputs.outputs, outputs.timestamp, iteration_stats
                )
                if processed.request_ids_to_abort:
                    await self.engine_client.abort_requests_async(processed.request_ids_to_abort)
                if self.stat_loggers is not None:
                    self.stat_loggers.record(outputs.engine_index, outputs.scheduler_stats, iteration_stats)
        except EngineDeadError as error:
            self.output_processor.propagate_error(error)
        except Exception as error:
            logger.exception("output handler failed")
            self.output_processor.propagate_error(EngineDeadError(f"output handler failed: {error}"))

    async def _resume(self, lost: EngineLost) -> None:
        """A lost engine's requests continue on another engine (or its restart) from the tokens
        already streamed; those that cannot end with an error naming why."""
        if not lost.can_resume:
            self.output_processor.propagate_error(EngineDeadError(lost.reason), lost.request_ids)
            return
        requests, failed = self.output_processor.resumed_requests(lost.request_ids, lost.suspect_request_ids)
        for request_id in failed:
            logger.error("request %s failed: an engine failed twice while running it", request_id)
            self.output_processor.propagate_error(
                EngineDeadError(f"request {request_id} was running when engines failed twice ({lost.reason}); "
                                "not retried again"),
                [request_id],
            )
        if requests:
            logger.warning("%s: resuming %d requests", lost.reason, len(requests))
            await self.engine_client.resume_requests_async(requests)

    async def _run_stats_log(self, interval_s: float) -> None:
        assert self.stat_loggers is not None
        while True:
            await asyncio.sleep(interval_s)
            self.stat_loggers.keep_engines(self.engine_client.live_engine_indices)
            self.stat_loggers.log()

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        self.engine_client.shutdown()
