"""LLMEngine: the synchronous face of the engine — `add_request()`, then `step()` until done."""

from __future__ import annotations

import logging
import weakref

from proto import envs
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest
from proto.engine_output import SchedulerStats
from service.client.make_client import make_client
from service.frontend.input_processor import InputProcessor
from service.frontend.output_processor import OutputProcessor
from service.frontend.outputs import RequestOutput
from service.frontend.sampling_params import SamplingParams
from service.model_files.tokenizer import Tokenizer
from service.observability.stat_loggers import LoggingStatLogger
from service.observability.stats import IterationStats

logger = logging.getLogger(__name__)


class _ParentState:
    """A request's n samples: their child request ids, and how many are still running."""

    def __init__(self, child_ids: list[str]) -> None:
        self.child_ids = child_ids
        self.num_unfinished = len(child_ids)


class LLMEngine:
    """A thin shell over an engine client: input processing in, detokenized deltas out."""

    def __init__(
        self,
        engine_config: EngineConfig,
        tokenizer: Tokenizer,
        multiprocess_mode: bool | None = None,
        stats_log_interval_s: float | None = None,
    ) -> None:
        if multiprocess_mode is None:
            multiprocess_mode = envs.enable_multiprocessing()
        self.tokenizer = tokenizer
        self.engine_core = make_client(engine_config, multiprocess_mode, asyncio_mode=False)
        self._finalizer = weakref.finalize(self, self.engine_core.shutdown)
        ready = self.engine_core.ready
        self.model_name = ready.model_name
        self.input_processor = InputProcessor(
            tokenizer, ready.max_model_len, ready.vocab_size, ready.structured_output_backend
        )
        self.output_processor = OutputProcessor(tokenizer)
        interval = envs.stats_log_interval() if stats_log_interval_s is None else stats_log_interval_s
        self.stat_logger = LoggingStatLogger(interval) if interval > 0 else None
        # child request id → (parent request id, sample index)
        self._children: dict[str, tuple[str, int]] = {}
        self._parents: dict[str, _ParentState] = {}
        self._is_sleeping = False

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        priority: int = 0,
        prompt_text: str | None = None,
    ) -> None:
        """Tokenizes and checks the prompt, then sends its n samples to the engine."""
        if isinstance(prompt, str):
            prompt_text, prompt_token_ids = prompt, self.input_processor.text_prompt(prompt).token_ids
        else:
            prompt_token_ids = list(prompt)
        requests = self.input_processor.process(request_id, prompt_token_ids, params, priority)
        self.add_processed(request_id, requests, params, prompt_text)

    def add_processed(
        self,
        request_id: str,
        requests: list[EngineCoreRequest],
        params: SamplingParams,
        prompt_text: str | None = None,
    ) -> None:
        """Sends the samples InputProcessor.process made of one request; their outputs come out
        of `step()` under `request_id`."""
        if self._is_sleeping:
            raise RuntimeError("the engine is asleep: call wake_up() before adding requests")
        if request_id in self._parents:
            raise ValueError(f"request id {request_id!r} is already in flight")
        self._parents[request_id] = _ParentState([request.request_id for request in requests])
        for index, request in enumerate(requests):
            self._children[request.request_id] = (request_id, index)
            self.output_processor.add_request(request, params, prompt_text)
            self.engine_core.add_request(request)

    def step(self) -> list[RequestOutput]:
        """One batch of engine outputs, as deltas (`outputs[0].index` is the sample's index)."""
        outputs = self.engine_core.get_output()
        iteration_stats = None if self.stat_logger is None else IterationStats(outputs.engine_index)
        processed = self.output_processor.process_outputs(outputs.outputs, outputs.timestamp, iteration_stats)
        self.engine_core.abort_requests(processed.request_ids_to_abort)
        if self.stat_logger is not None:
            self.stat_logger.record(outputs.engine_index, outputs.scheduler_stats, iteration_stats)
            self.stat_logger.maybe_log()
        return [self._to_parent(output) for output in processed.request_outputs]

    def _to_parent(self, output: RequestOutput) -> RequestOutput:
        child_id = output.request_id
        parent_id, index = self._children[child_id]
        output.request_id = parent_id
        output.outputs[0].index = index
        if output.finished:
            del self._children[child_id]
            parent = self._parents[parent_id]
            parent.num_unfinished -= 1
            output.finished = parent.num_unfinished == 0
            if output.finished:
                del self._parents[parent_id]
        return output

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_unfinished_requests(self) -> int:
        return len(self._parents)

    def abort_request(self, request_ids: list[str]) -> None:
        """Stops requests (by the ids they were added with); their outputs end where they are."""
        # NOTE: the parents' samples still running (a finished one is already out of `_children`).
        child_ids = [
            child for request_id in request_ids if request_id in self._parents
            for child in self._parents[request_id].child_ids if child in self._children
        ]
        self.output_processor.abort_requests(child_ids)
        self.engine_core.abort_requests(child_ids)
        for child in child_ids:
            del self._children[child]
        for request_id in request_ids:
            self._parents.pop(request_id, None)

    def reset_prefix_cache(self) -> bool:
        return self.engine_core.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Frees the KV cache (level 1) and the weights (level 2); requests are refused until
        `wake_up()`."""
        self.engine_core.sleep(level)
        self._is_sleeping = True

    def wake_up(self) -> None:
        self.engine_core.wake_up()
        self._is_sleeping = False

    def is_sleeping(self) -> bool:
        return self._is_sleeping

    def get_stats(self) -> SchedulerStats:
        """The engine's state now: requests running and waiting, KV cache, prefix cache, drafts."""
        return self.engine_core.get_stats()

    def shutdown(self) -> None:
        self._finalizer()
