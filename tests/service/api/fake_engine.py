"""FakeEngineClient: an engine without a model, for route tests that run in process.

It answers every request with the same tokens, `token_ids` (a fixed sentence, repeated), and
stops them as the engine does: on EOS (unless ignore_eos), on a stop token id (its stop_reason),
or at max_tokens (after min_tokens). It scores tokens with made-up logprobs in the engine's
layout: the chosen token first (the most likely), then the top ones.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from proto.engine_input import EngineCoreRequest
from proto.engine_output import (
    EngineCoreEvent,
    EngineCoreEventType,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    Logprobs,
    SchedulerStats,
)
from proto.handshake import EngineReady
from service.client.core_client import EngineCoreClient, EngineDeadError
from service.client.engine_state import EngineLost
from service.model_files.tokenizer import Tokenizer

SENTENCE = " The quick brown fox jumps over the lazy dog."
MAX_MODEL_LEN = 2048


class _Running:
    """One request in the fake engine, and how far it has got."""

    def __init__(self, request: EngineCoreRequest) -> None:
        self.request = request
        self.num_output_tokens = 0
        self.is_new = True


class FakeEngineClient(EngineCoreClient):
    """Steps every running request by `num_tokens_per_step` tokens per `get_output_async`, a step
    taking `seconds_per_step`; a test reads what it was sent (`requests`, `aborted_ids`,
    `utility_calls`) and can make it die."""

    def __init__(self, tokenizer: Tokenizer, num_tokens_per_step: int = 1, seconds_per_step: float = 0.0) -> None:
        assert tokenizer.eos_token_id is not None
        self.tokenizer = tokenizer
        self.token_ids = tokenizer.encode(SENTENCE)
        self.eos_token_id = tokenizer.eos_token_id
        self.num_tokens_per_step = num_tokens_per_step
        self.seconds_per_step = seconds_per_step
        # NOTE: the prompt tokens every output says the prefix cache held.
        self.num_cached_tokens = 0
        self.ready = EngineReady(
            engine_index=0, model_name="fake", max_model_len=MAX_MODEL_LEN, num_kv_blocks=128, block_size=16,
            vocab_size=tokenizer.vocab_size, eos_token_ids=[self.eos_token_id], host="localhost",
            cpu="fake CPU", kernel_choices={"linears": "fake", "head": "fake", "attention": "fake"},
        )
        self.requests: list[EngineCoreRequest] = []
        self.aborted_ids: list[str] = []
        self.utility_calls: list[str] = []
        self._running: dict[str, _Running] = {}
        self._has_work = asyncio.Event()
        self._is_dead = False
        # NOTE: set, constrained requests end at once with this error, as the engine's do when their
        # grammar does not compile (in time).
        self.grammar_error: str | None = None
        self._num_steps_to_failure: int | None = None
        self._is_failure_lost = False
        self._can_resume = True
        self._is_fatal_step = False
        self._failure_every = 0
        self._num_failures_left = 0

    @property
    def is_dead(self) -> bool:
        return self._is_dead

    @property
    def running_ids(self) -> list[str]:
        return list(self._running)

    def output_ids(self, num_tokens: int) -> list[int]:
        """The first `num_tokens` tokens every request is answered with."""
        return [self.token_ids[i % len(self.token_ids)] for i in range(num_tokens)]

    def output_text(self, num_tokens: int) -> str:
        return self.tokenizer.decode(self.output_ids(num_tokens))

    def die_after(self, num_steps: int) -> None:
        """The engine process dies after `num_steps` more steps with requests to run (0: now);
        then every request and call fails."""
        self._num_steps_to_failure, self._is_failure_lost = num_steps, False
        self._has_work.set()

    def lose_requests_after(
        self, num_steps: int, can_resume: bool = True, is_fatal_step: bool = False, num_times: int = 1
    ) -> None:
        """After `num_steps` more steps the running requests' engine goes away (EngineLost): the
        gateway resumes them here (`resume_requests_async`), or with `can_resume` False (no engine
        came back in time) they fail; either way it serves later requests. With `is_fatal_step`
        the engine reports that its step with them failed (they are suspects). It happens
        `num_times` times, `num_steps` steps apart."""
        self._num_steps_to_failure, self._is_failure_lost = num_steps, True
        self._can_resume, self._is_fatal_step = can_resume, is_fatal_step
        self._failure_every, self._num_failures_left = num_steps, num_times
        self._has_work.set()

    async def wait_ready(self, timeout: float = 300.0) -> EngineReady:
        return self.ready

    async def add_request_async(self, request: EngineCoreRequest) -> None:
        if self._is_dead:
            raise EngineDeadError("engine is dead")
        self.requests.append(request)
        self._running[request.request_id] = _Running(request)
        self._has_work.set()

    async def resume_requests_async(self, requests: list[EngineCoreRequest]) -> None:
        """Continues each request after the output it already has, as a live engine would."""
        for request in requests:
            await self.add_request_async(request)
            self._running[request.request_id].num_output_tokens = len(request.resumed_token_ids)

    async def abort_requests_async(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            if self._running.pop(request_id, None) is not None:
                self.aborted_ids.append(request_id)

    async def get_output_async(self) -> EngineCoreOutputs | EngineLost:
        while not self._running and self._num_steps_to_failure != 0 and not self._is_dead:
            self._has_work.clear()
            await self._has_work.wait()
        await asyncio.sleep(self.seconds_per_step)  # NOTE: the routes run meanwhile.
        if self._num_steps_to_failure == 0:
            return self._fail()
        if self._is_dead:
            raise EngineDeadError("engine is dead: killed by the test")
        if self._num_steps_to_failure is not None:
            self._num_steps_to_failure -= 1
        return self._step()

    def _fail(self) -> EngineLost:
        self._num_failures_left -= 1
        self._num_steps_to_failure = self._failure_every if self._num_failures_left > 0 else None
        lost_ids, self._running = list(self._running), {}
        if self._is_failure_lost:
            suspects = lost_ids if self._is_fatal_step else []
            return EngineLost(0, lost_ids, "the engine stopped answering", self._can_resume, suspects)
        self._is_dead = True
        raise EngineDeadError("engine is dead: killed by the test")

    def _step(self) -> EngineCoreOutputs:
        now = time.time()
        outputs = [self._advance(running, now) for running in list(self._running.values())]
        stats = SchedulerStats(num_running_reqs=len(self._running))
        return EngineCoreOutputs(engine_index=0, outputs=outputs, timestamp=now, scheduler_stats=stats)

    def _advance(self, running: _Running, now: float) -> EngineCoreOutput:
        request, params = running.request, running.request.sampling_params
        output = EngineCoreOutput(request.request_id, [], num_cached_tokens=self.num_cached_tokens)
        if self.grammar_error is not None and params.structured_output is not None:
            del self._running[request.request_id]
            return EngineCoreOutput(request.request_id, [], FinishReason.ERROR, self.grammar_error)
        if params.num_logprobs is not None:
            output.new_logprobs = Logprobs()
        if running.is_new:
            running.is_new = False
            output.events = [EngineCoreEvent(EngineCoreEventType.QUEUED, request.arrival_time),
                             EngineCoreEvent(EngineCoreEventType.SCHEDULED, now)]
            if params.num_prompt_logprobs is not None:
                output.prompt_logprobs = self._prompt_logprobs(request.prompt_token_ids, params.num_prompt_logprobs)
        while len(output.new_token_ids) < self.num_tokens_per_step and output.finish_reason is None:
            token_id = self.token_ids[running.num_output_tokens % len(self.token_ids)]
            running.num_output_tokens += 1
            output.new_token_ids.append(token_id)
            if output.new_logprobs is not None and params.num_logprobs is not None:
                output.new_logprobs.extend(self._logprobs(token_id, params.num_logprobs))
            output.finish_reason, output.stop_reason = self._finish(running, token_id)
        if output.finish_reason is not None:
            del self._running[request.request_id]
        return output

    def _finish(self, running: _Running, token_id: int) -> tuple[FinishReason | None, int | None]:
        request, params = running.request, running.request.sampling_params
        may_stop = running.num_output_tokens >= params.min_tokens
        if may_stop and not params.ignore_eos and token_id == self.eos_token_id:
            return FinishReason.STOP, None
        if may_stop and token_id in params.stop_token_ids:
            return FinishReason.STOP, token_id
        num_tokens = len(request.prompt_token_ids) + running.num_output_tokens
        if running.num_output_tokens >= params.max_tokens or num_tokens >= self.ready.max_model_len:
            return FinishReason.LENGTH, None
        return None, None

    def _logprobs(self, token_id: int, num_top: int) -> Logprobs:
        """One position: `token_id` chosen, the most likely (rank 1), then the top `num_top`."""
        top_ids = [(token_id + i) % self.ready.vocab_size for i in range(num_top)]
        top_values = [-0.5 * (i + 1) for i in range(num_top)]
        return Logprobs([[token_id, *top_ids]], [[-0.5, *top_values]], [1])

    def _prompt_logprobs(self, prompt_token_ids: list[int], num_top: int) -> Logprobs:
        """Every prompt token but the first, scored as given the ones before it."""
        logprobs = Logprobs()
        for token_id in prompt_token_ids[1:]:
            logprobs.extend(self._logprobs(token_id, num_top))
        return logprobs

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        if self._is_dead:
            raise EngineDeadError("engine is dead")
        self.utility_calls.append(method)
        if method == "ping":
            return "pong"
        if method == "reset_prefix_cache":
            return True
        if method in ("sleep", "wake_up"):
            return None
        if method == "get_stats":
            # NOTE: as it comes off the wire: msgpack's map of the engine's SchedulerStats.
            return dataclasses.asdict(SchedulerStats(num_running_reqs=len(self._running)))
        raise ValueError(f"the fake engine has no utility {method!r}")

    def shutdown(self) -> None:
        """Nothing to stop: no process, no sockets."""
