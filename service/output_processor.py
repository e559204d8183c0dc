"""Engine outputs → detokenized RequestOutput deltas → each request's collector."""

from __future__ import annotations

import asyncio
from proto.engine_output import EngineCoreOutput, FinishReason
from service.detokenizer import IncrementalDetokenizer
from service.outputs import CompletionOutput, RequestOutput
from service.stop_checker import StopCheck, StopChecker
from service.tokenizer import Tokenizer


class RequestOutputCollector:
    """One request's mailbox between the output handler and `generate()`; merges unread deltas."""

    def __init__(self) -> None:
        self._output: RequestOutput | BaseException | None = None
        self._ready = asyncio.Event()

    def put(self, output: RequestOutput | BaseException) -> None:
        if isinstance(self._output, RequestOutput) and isinstance(output, RequestOutput):
            self._output.merge(output)
        elif not isinstance(self._output, BaseException):
            self._output = output
        self._ready.set()

    async def get(self) -> RequestOutput:
        while self._output is None:
            await self._ready.wait()
        return self._take()

    def get_nowait(self) -> RequestOutput | None:
        return None if self._output is None else self._take()

    def _take(self) -> RequestOutput:
        output, self._output = self._output, None
        self._ready.clear()
        if isinstance(output, BaseException):
            raise output
        assert output is not None
        return output


class RequestState:
    """The gateway's state of one request in flight."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        detokenizer: IncrementalDetokenizer,
        stop_checker: StopChecker,
        collector: RequestOutputCollector,
        min_tokens: int = 0,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.detokenizer = detokenizer
        self.stop_checker = stop_checker
        self.collector = collector
        self.min_tokens = min_tokens
        self.num_output_tokens = 0

    def make_output(self, engine_output: EngineCoreOutput) -> RequestOutput:
        delta = self.detokenizer.update(engine_output.new_token_ids)
        self.num_output_tokens += len(engine_output.new_token_ids)
        # NOTE: as in vLLM, stop strings count only once min_tokens have been generated.
        check = self.stop_checker.update(delta) if self.num_output_tokens >= self.min_tokens else StopCheck(delta, None)
        text = check.text
        finish_reason: FinishReason | None = engine_output.finish_reason
        stop_reason = engine_output.stop_reason
        if check.stop_str is not None:
            finish_reason, stop_reason = FinishReason.STOP, check.stop_str
        elif finish_reason is not None:
            text += self.stop_checker.flush()
        completion = CompletionOutput(
            index=0,
            text=text,
            token_ids=list(engine_output.new_token_ids),
            finish_reason=None if finish_reason is None else str(finish_reason),
            stop_reason=stop_reason,
            logprobs=engine_output.new_logprobs,
        )
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            [completion],
            finished=finish_reason is not None,
            num_cached_tokens=engine_output.num_cached_tokens,
            prompt_logprobs=engine_output.prompt_logprobs,
        )


class OutputProcessor:
    """Maps request ids to their state and routes each engine output to its collector."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    @property
    def num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def add_request(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        collector: RequestOutputCollector,
        stop_checker: StopChecker | None = None,
        min_tokens: int = 0,
    ) -> None:
        if request_id in self.request_states:
            raise ValueError(f"request id {request_id!r} is already in flight")
        detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_token_ids)
        self.request_states[request_id] = RequestState(
            request_id, prompt, prompt_token_ids, detokenizer, stop_checker or StopChecker(()), collector,
            min_tokens,
        )

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.request_states.pop(request_id, None)

    def process_outputs(self, engine_outputs: list[EngineCoreOutput]) -> list[str]:
        """Routes the outputs; returns the ids of requests a stop string ended here, which the
        engine is still running and must abort."""
        request_ids_to_abort = []
        for engine_output in engine_outputs:
            state = self.request_states.get(engine_output.request_id)
            if state is None:
                continue  # NOTE: aborted here while the engine was still producing it.
            output = state.make_output(engine_output)
            if output.finished:
                del self.request_states[state.request_id]
                if not engine_output.is_finished:
                    request_ids_to_abort.append(state.request_id)
            state.collector.put(output)
        return request_ids_to_abort

    def propagate_error(self, error: BaseException) -> None:
        """Ends every request in flight with `error` (the engine is gone)."""
        for state in self.request_states.values():
            state.collector.put(error)
        self.request_states.clear()
