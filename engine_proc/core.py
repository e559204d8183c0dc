"""EngineCore: scheduler + model runner, stepped by whoever owns it (a process or a client)."""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine_proc.kv_cache_manager import KVCacheManager
from engine_proc.kv_events import KVEventPublisher
from engine_proc.memory_report import committed_memory_bytes, device_name, resident_bytes, tensor_bytes
from engine_proc.model_runner import ModelRunner, ModelRunnerOutput
from engine_proc.ngram_proposer import NgramProposer
from engine_proc.request import Request
from engine_proc.scheduler import Scheduler, SchedulerConfig
from engine_proc.structured_output import StructuredOutputManager
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, UtilityCall
from proto.engine_output import EngineCoreOutput, EngineCoreOutputs, FinishReason, SchedulerStats, UtilityResult
from proto.handshake import EngineReady
from proto.model_support import is_encoder_folder

logger = logging.getLogger(__name__)

_COMPILE_POLL_S = 0.002


class EngineCore:
    """Admits requests, steps the batch, and reports new tokens."""

    def __init__(self, config: EngineConfig, engine_index: int = 0) -> None:
        self.config = config
        self.engine_index = engine_index
        started = time.monotonic()
        # NOTE: what the process holds before the model: with the weights and the KV cache, what it holds at most.
        self.runtime_bytes = resident_bytes()
        self.model_runner = ModelRunner(config)
        model_config = self.model_runner.model_config
        self.eos_token_ids = tuple(model_config.eos_token_ids)
        num_blocks = self.model_runner.num_kv_blocks
        self.max_model_len = config.max_model_len or model_config.max_position_embeddings
        num_cache_tokens = num_blocks * config.block_size
        if self.max_model_len > num_cache_tokens:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the KV cache's {num_cache_tokens} "
                "tokens: raise the KV cache memory or lower max_model_len"
            )
        kv_events = config.kv_events
        self.kv_event_publisher = KVEventPublisher(kv_events, engine_index) if kv_events.is_publishing else None
        self.scheduler = Scheduler(
            SchedulerConfig.of(config, self.max_model_len),
            KVCacheManager(
                num_blocks, config.block_size, config.enable_prefix_caching, self.kv_event_publisher is not None
            ),
            *_drafting(config),
        )
        self._rejected: list[EngineCoreOutput] = []
        self.instance_id = uuid.uuid4().hex
        # NOTE: the requests being added or stepped: if that raises, the gateway is told they may be why.
        self.suspect_request_ids: list[str] = []
        self._structured_output: StructuredOutputManager | None = None
        # NOTE: waiting requests whose grammar still compiles, checked each step.
        self._compiling: list[Request] = []
        self._utilities: dict[str, Callable[..., Any]] = {
            "ping": lambda: "pong",
            "get_stats": self.get_stats,
            "reset_prefix_cache": self.reset_prefix_cache,
            "sleep": self.sleep,
            "wake_up": self.wake_up,
            "is_sleeping": self.is_sleeping,
        }
        # NOTE: a headless engine (index -1) learns its index from the gateway it joins.
        name = "engine" if engine_index < 0 else f"engine {engine_index}"
        logger.info(
            "%s ready in %.1fs: %d KV blocks of %d tokens, max_model_len %d",
            name, time.monotonic() - started, num_blocks, config.block_size, self.max_model_len,
        )

    def ready_message(self) -> EngineReady:
        device, model = device_name(self.model_runner.device), self.model_runner.model
        ready = EngineReady(
            engine_index=self.engine_index,
            model_name=self.config.model_name,
            max_model_len=self.max_model_len,
            num_kv_blocks=self.scheduler.kv_cache_manager.num_blocks,
            block_size=self.config.block_size,
            vocab_size=self.model_runner.model_config.vocab_size,
            eos_token_ids=list(self.eos_token_ids),
            host=socket.gethostname(),
            cpu=self.model_runner.device_description,
            kernel_choices=self.model_runner.kernel_choices,
            structured_output_backend="guidance" if self.config.structured_outputs.backend == "guidance" else "xgrammar",
            instance_id=self.instance_id,
            device=device,
            weight_bytes=tensor_bytes(model.weight_tensors()),
            kv_cache_bytes=tensor_bytes(self.model_runner.attention.kv_caches),
            runtime_bytes=0 if device.startswith("cuda") else self.runtime_bytes,
        )
        ready.memory_bytes = committed_memory_bytes(ready)
        return ready

    def set_engine_index(self, engine_index: int) -> None:
        """The index the gateway gave this engine (an engine on another host asks for one)."""
        self.engine_index = engine_index

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_unfinished_requests or bool(self._rejected)

    def add_request(self, core_request: EngineCoreRequest) -> None:
        self.suspect_request_ids = [core_request.request_id]
        self._add_request(core_request)
        self.suspect_request_ids = []

    def _add_request(self, core_request: EngineCoreRequest) -> None:
        if core_request.request_id in self.scheduler.requests:
            # NOTE: a replayed message: an answer under this id would end the request already running.
            logger.warning("dropping request %s: a request with that id is running", core_request.request_id)
            return
        # NOTE: the gateway validates first; this guards the engine against any client.
        problem = self._invalid(core_request)
        if problem is not None:
            logger.warning("rejecting request %s: %s", core_request.request_id, problem)
            self._rejected.append(EngineCoreOutput(core_request.request_id, [], FinishReason.ERROR, problem))
            return
        if self.is_sleeping():
            logger.warning("rejecting request %s: the engine is asleep", core_request.request_id)
            self._rejected.append(
                EngineCoreOutput(
                    core_request.request_id, [], FinishReason.ERROR, "the engine is asleep; wake it up first"
                )
            )
            return
        request = Request(core_request, self.eos_token_ids)
        spec = core_request.sampling_params.structured_output
        if spec is not None:
            request.grammar = self.structured_output.grammar_for(spec)
            self._compiling.append(request)
        self.scheduler.add_request(request)

    def _invalid(self, core_request: EngineCoreRequest) -> str | None:
        """Why the engine cannot run this request (a prompt's length, a token id outside the
        vocabulary), or None."""
        num_prompt = len(core_request.prompt_token_ids)
        if num_prompt == 0 or num_prompt + len(core_request.resumed_token_ids) >= self.max_model_len:
            return "invalid prompt length"
        params = core_request.sampling_params
        vocab_size = self.model_runner.model_config.vocab_size
        token_ids = [
            *core_request.prompt_token_ids, *core_request.resumed_token_ids, *params.stop_token_ids,
            *(i for i, _ in params.logit_bias),
        ]
        if min(token_ids) < 0 or max(token_ids) >= vocab_size:
            return f"a token id outside the vocabulary (0 to {vocab_size - 1})"
        return None

    @property
    def structured_output(self) -> StructuredOutputManager:
        """Made with the first constrained request (it reads the tokenizer on its first compile)."""
        if self._structured_output is None:
            self._structured_output = StructuredOutputManager(
                self.config.model_path, self.model_runner.model_config.vocab_size, self.eos_token_ids,
                self.config.structured_outputs.compile_timeout_s, self.config.structured_outputs.backend,
            )
            self.model_runner.structured_output = self._structured_output
        return self._structured_output

    def _check_compiled(self) -> None:
        """Ends the requests whose grammar did not compile (in time), with the reason."""
        still_compiling = []
        for request in self._compiling:
            request.grammar.check_deadline()
            if not request.grammar.is_ready:
                still_compiling.append(request)
            elif request.grammar.error is None:
                # NOTE: a resumed request's output so far moves its grammar to where it stopped.
                for token_id in request.output_token_ids:
                    request.grammar.accept(token_id)
            elif not request.is_finished:
                logger.warning("request %s: %s", request.request_id, request.grammar.error)
                self.scheduler.abort_requests([request.request_id])
                self._rejected.append(
                    EngineCoreOutput(request.request_id, [], FinishReason.ERROR, request.grammar.error)
                )
        self._compiling = still_compiling

    def abort_requests(self, request_ids: list[str]) -> None:
        for request in self.scheduler.abort_requests(request_ids):
            self.model_runner.free_request(request.request_id)

    def step(self) -> EngineCoreOutputs:
        """Schedule → run → update; returns this step's new tokens."""
        if self._compiling:
            self._check_compiled()
        outputs, self._rejected = self._rejected, []
        scheduler_output = self.scheduler.schedule()
        self.suspect_request_ids = [s.request.request_id for s in scheduler_output.scheduled]
        if scheduler_output.is_empty and not outputs and self._compiling:
            time.sleep(_COMPILE_POLL_S)  # NOTE: only grammars to wait for: no busy spin against their thread
        runner_output = ModelRunnerOutput([], {}, {})
        if not scheduler_output.is_empty:
            runner_output = self.model_runner.execute_model(scheduler_output)
            outputs += self.scheduler.update_from_output(scheduler_output, runner_output.sampled_token_ids)
        for output in outputs:
            if output.is_finished:
                self.model_runner.free_request(output.request_id)
            output.new_logprobs = runner_output.logprobs.get(output.request_id)
            output.prompt_logprobs = runner_output.prompt_logprobs.get(output.request_id)
        self.suspect_request_ids = []
        self._publish_kv_events()
        return self.idle_outputs(outputs)

    def _publish_kv_events(self) -> None:
        """What the step (or a reset) did to the prefix cache, to the routers that follow it."""
        if self.kv_event_publisher is not None:
            if events := self.scheduler.kv_cache_manager.take_kv_events():
                self.kv_event_publisher.publish(events, max(self.engine_index, 0))

    def idle_outputs(self, outputs: list[EngineCoreOutput] | None = None) -> EngineCoreOutputs:
        """`outputs` (none: what an engine left idle by aborts reports) and the scheduler's stats."""
        return EngineCoreOutputs(
            engine_index=self.engine_index, outputs=outputs or [], timestamp=time.time(),
            scheduler_stats=self.get_stats(),
        )

    def call_utility(self, call: UtilityCall) -> UtilityResult:
        method = self._utilities.get(call.method)
        if method is None:
            return UtilityResult(call.call_id, error=f"unknown utility method {call.method!r}")
        try:
            return UtilityResult(call.call_id, result=method(*call.args))
        except Exception as exc:  # noqa: BLE001 - the error goes back to the caller
            return UtilityResult(call.call_id, error=f"{type(exc).__name__}: {exc}")

    def reset_prefix_cache(self) -> bool:
        """Forgets all cached prefixes (e.g. after new weights); running requests are unaffected."""
        self.scheduler.kv_cache_manager.reset_prefix_cache()
        self._publish_kv_events()
        return True

    def get_stats(self) -> SchedulerStats:
        """The scheduler's state now: every step's outputs carry it, and the `get_stats` utility answers it."""
        scheduler, kv_cache_manager = self.scheduler, self.scheduler.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=len(scheduler.running),
            num_waiting_reqs=len(scheduler.waiting),
            kv_cache_usage=kv_cache_manager.usage,
            num_prefix_cache_queries=kv_cache_manager.num_prefix_queries,
            num_prefix_cache_hits=kv_cache_manager.num_prefix_hits,
            num_preemptions=scheduler.num_preemptions,
            num_draft_tokens=scheduler.num_draft_tokens,
            num_accepted_tokens=scheduler.num_accepted_tokens,
            num_free_blocks=kv_cache_manager.num_free_blocks,
        )

    def sleep(self, level: int = 1) -> bool:
        """Frees the KV cache (level 1) and the weights (level 2) until `wake_up()`; only idle."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level}")
        if self.scheduler.has_unfinished_requests:
            num = len(self.scheduler.running) + len(self.scheduler.waiting)
            raise ValueError(f"cannot sleep with {num} requests in flight; let them finish or abort them")
        # NOTE: the cached blocks' contents are about to go.
        self.scheduler.kv_cache_manager.reset_prefix_cache()
        self._publish_kv_events()
        self.model_runner.sleep(level)
        logger.info("engine %d asleep (level %d)", self.engine_index, level)
        return True

    def wake_up(self) -> bool:
        if self.is_sleeping():
            self.model_runner.wake_up()
            logger.info("engine %d awake", self.engine_index)
        return True

    def is_sleeping(self) -> bool:
        return self.model_runner.sleep_level > 0

    def shutdown(self) -> None:
        """Frees the weights and the KV cache (for an engine living in its caller's process)."""
        self.model_runner.sleep(2)
        if self._structured_output is not None:
            self._structured_output.shutdown()
        if self.kv_event_publisher is not None:
            self.kv_event_publisher.close()


def _drafting(config: EngineConfig) -> tuple[NgramProposer | None, int | None]:
    """The scheduler's drafter and the batch size above which it rests, from the speculative config."""
    speculative = config.speculative
    if speculative is None:
        return None, None
    proposer = NgramProposer(
        speculative.num_speculative_tokens, speculative.prompt_lookup_min, speculative.prompt_lookup_max
    )
    return proposer, speculative.disable_by_batch_size


def make_core(config: EngineConfig, engine_index: int = 0) -> Any:
    """The engine core the model calls for: EngineCore for a generating model, EncoderCore for an encoder
    (embeddings and scores)."""
    if is_encoder_folder(Path(config.model_path)):
        from engine_proc.encoder_core import EncoderCore

        return EncoderCore(config, engine_index)
    return EngineCore(config, engine_index)
