"""Engine outputs → detokenized RequestOutput deltas → each request's collector."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field, replace

from proto.engine_input import EngineCoreRequest
from proto.engine_output import EngineCoreOutput, FinishReason, Logprobs
from service.frontend.detokenizer import IncrementalDetokenizer
from service.frontend.outputs import CompletionOutput, RequestOutput
from service.frontend.sampling_params import SamplingParams
from service.frontend.stop_checker import StopCheck, StopChecker
from service.model_files.tokenizer import Tokenizer
from service.observability.stats import IterationStats, RequestStateStats


class RequestOutputCollector:
    """One request's mailbox between the output handler and `generate()`, shared by its
    samples: the unread deltas of each sample merged into one, by the sample's position."""

    def __init__(self) -> None:
        self._outputs: dict[int, RequestOutput] = {}
        self._error: BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, index: int, output: RequestOutput) -> None:
        unread = self._outputs.get(index)
        if unread is None:
            self._outputs[index] = output
        else:
            unread.add(output)
        self._ready.set()

    def put_error(self, error: BaseException) -> None:
        self._error = self._error or error
        self._ready.set()

    async def get(self) -> list[tuple[int, RequestOutput]]:
        """The unread deltas as (position, delta), waiting for one if there are none."""
        while not self._outputs and self._error is None:
            await self._ready.wait()
        return self._take()

    def get_nowait(self) -> list[tuple[int, RequestOutput]]:
        return self._take()

    def _take(self) -> list[tuple[int, RequestOutput]]:
        if self._error is not None:
            raise self._error
        outputs, self._outputs = list(self._outputs.items()), {}
        self._ready.clear()
        return outputs


class RequestState:
    """The gateway's state of one request in flight."""

    def __init__(
        self,
        request: EngineCoreRequest,
        prompt: str | None,
        detokenizer: IncrementalDetokenizer,
        stop_checker: StopChecker,
        collector: RequestOutputCollector | None,
        index: int,
        arrival_time: float,
        n: int = 1,
    ) -> None:
        self.request_id = request.request_id
        self.request = request
        # NOTE: every token its engines sent: where a resumed request continues from.
        self.token_ids: list[int] = []
        self.num_resumes = 0
        self.num_suspected = 0
        self.prompt = prompt
        self.prompt_token_ids = request.prompt_token_ids
        self.detokenizer = detokenizer
        self.stop_checker = stop_checker
        self.collector = collector
        self.index = index
        self.min_tokens = request.sampling_params.min_tokens
        self.num_output_tokens = 0
        self.num_cached_tokens = 0
        self.engine_index = 0  # NOTE: the engine its outputs came from (the first, until one has).
        is_first_sample = index % n == 0
        self.stats = RequestStateStats(arrival_time, max_tokens=request.sampling_params.max_tokens, n=n if is_first_sample else 0)

    def resumed_request(self) -> EngineCoreRequest:
        """This request as another engine continues it: its output so far recomputed, not sent
        again (nor its prompt's logprobs, once sent)."""
        self.num_resumes += 1
        params = self.request.sampling_params
        if self.token_ids:
            params = replace(params, num_prompt_logprobs=None)
        return replace(self.request, sampling_params=params, resumed_token_ids=list(self.token_ids))

    def make_output(self, engine_output: EngineCoreOutput) -> RequestOutput:
        if not self.num_resumes:
            # NOTE: a resumed request's cache hits are the new engine's, not the client's prompt's.
            self.num_cached_tokens = engine_output.num_cached_tokens
        self.token_ids += engine_output.new_token_ids
        check, num_kept = self._text_of(engine_output.new_token_ids)
        text = check.text
        finish_reason: FinishReason | None = engine_output.finish_reason
        stop_reason = engine_output.stop_reason
        if check.stop_str is not None:
            finish_reason, stop_reason = FinishReason.STOP, check.stop_str
        elif finish_reason is not None:
            text += self.stop_checker.flush()
        logprobs = engine_output.new_logprobs
        if logprobs is not None and num_kept < len(engine_output.new_token_ids):
            logprobs = Logprobs(logprobs.token_ids[:num_kept], logprobs.logprobs[:num_kept], logprobs.ranks[:num_kept])
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=list(engine_output.new_token_ids[:num_kept]),
            finish_reason=None if finish_reason is None else str(finish_reason),
            stop_reason=stop_reason,
            logprobs=logprobs,
        )
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            [completion],
            finished=finish_reason is not None,
            num_cached_tokens=self.num_cached_tokens,
            prompt_logprobs=engine_output.prompt_logprobs,
            pooled=engine_output.pooled,
        )

    def _text_of(self, token_ids: list[int]) -> tuple[StopCheck, int]:
        """The text the new tokens release, the stop string they reach if any, and how many of
        them count: a stop string reached inside a step of several tokens (drafts) ends the
        output at the token that completes it, and the tokens after it are dropped."""
        if len(token_ids) == 1 or not self.stop_checker.stop:
            return self._check(self.detokenizer.update(token_ids), len(token_ids)), len(token_ids)
        texts = []
        for num_kept, token_id in enumerate(token_ids, start=1):
            check = self._check(self.detokenizer.update([token_id]), 1)
            texts.append(check.text)
            if check.stop_str is not None:
                return StopCheck("".join(texts), check.stop_str), num_kept
        return StopCheck("".join(texts), None), len(token_ids)

    def _check(self, delta: str, num_tokens: int) -> StopCheck:
        # NOTE: as in vLLM, stop strings count only once min_tokens have been generated.
        self.num_output_tokens += num_tokens
        if self.num_output_tokens >= self.min_tokens:
            return self.stop_checker.update(delta)
        return StopCheck(delta, None)


@dataclass
class OutputProcessorOutput:
    """One batch's results: outputs of requests without a collector (the synchronous engine
    reads them), and requests a stop string ended here that the engine must still abort."""

    request_outputs: list[RequestOutput] = field(default_factory=list)
    request_ids_to_abort: list[str] = field(default_factory=list)


class OutputProcessor:
    """Maps request ids to their state and routes each engine output to its collector."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def add_request(
        self,
        request: EngineCoreRequest,
        params: SamplingParams,
        prompt: str | None = None,
        collector: RequestOutputCollector | None = None,
        index: int = 0,
    ) -> None:
        """Registers one sample's engine request (`params`: its parent's, stop strings and all);
        its outputs go to `collector` under `index`, or without one are returned by
        `process_outputs`."""
        if request.request_id in self.request_states:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        detokenizer = IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params.skip_special_tokens)
        stop_checker = StopChecker(params.stop, params.include_stop_str_in_output)
        self.request_states[request.request_id] = RequestState(
            request, prompt, detokenizer, stop_checker, collector, index, request.arrival_time or time.time(), params.n
        )

    def abort_requests(self, request_ids: list[str]) -> list[RequestState]:
        """Forgets the requests; returns the states of those that were still in flight."""
        return [state for request_id in request_ids if (state := self.request_states.pop(request_id, None))]

    def process_outputs(
        self,
        engine_outputs: list[EngineCoreOutput],
        engine_timestamp: float = 0.0,
        iteration_stats: IterationStats | None = None,
    ) -> OutputProcessorOutput:
        """Detokenizes and routes one batch of outputs, recording statistics when asked."""
        result = OutputProcessorOutput()
        for engine_output in engine_outputs:
            state = self.request_states.get(engine_output.request_id)
            if state is None:
                continue  # NOTE: aborted here while the engine was still producing it.
            if iteration_stats is not None:
                state.engine_index = iteration_stats.engine_index
                iteration_stats.update_from_output(
                    engine_output, engine_timestamp, len(state.prompt_token_ids), state.stats
                )
            output = state.make_output(engine_output)
            if output.finished:
                del self.request_states[state.request_id]
                if not engine_output.is_finished:
                    result.request_ids_to_abort.append(state.request_id)
                if iteration_stats is not None:
                    iteration_stats.update_from_finished_request(
                        state.request_id, output.outputs[0].finish_reason or "", len(state.prompt_token_ids),
                        state.num_cached_tokens, state.stats,
                    )
            if state.collector is not None:
                state.collector.put(state.index, output)
            else:
                result.request_outputs.append(output)
        return result

    def resumed_requests(
        self, request_ids: list[str], suspect_request_ids: list[str]
    ) -> tuple[list[EngineCoreRequest], list[str]]:
        """A lost engine's requests as they continue elsewhere, and the ids of those that must not:
        they were in its failing step a second time (their own input may be what kills engines)."""
        suspects = set(suspect_request_ids)
        resumed, failed = [], []
        for request_id in request_ids:
            state = self.request_states.get(request_id)
            if state is None:
                continue
            if request_id in suspects:
                state.num_suspected += 1
                if state.num_suspected > 1:
                    failed.append(request_id)
                    continue
            resumed.append(state.resumed_request())
        return resumed, failed

    def propagate_error(self, error: BaseException, request_ids: list[str] | None = None) -> None:
        """Ends the requests (all when None) with `error`: their engine is gone."""
        for request_id in list(self.request_states) if request_ids is None else request_ids:
            state = self.request_states.pop(request_id, None)
            if state is not None and state.collector is not None:
                state.collector.put_error(error)
