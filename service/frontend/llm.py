"""LLM: offline batches — `generate()` and `chat()` over many prompts, results in input order."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypedDict, cast

from tqdm import tqdm

from proto.engine_config import EngineConfig, settings_from
from proto.engine_output import SchedulerStats
from service.flags.engine_flags import engine_settings_from_env
from service.frontend.llm_engine import LLMEngine
from service.frontend.outputs import RequestOutput, accumulate
from service.frontend.sampling_params import SamplingParams, generation_defaults_of
from service.model_files.model_registry import DEFAULT_MODEL, ResolvedModel, resolve_model
from service.model_files.tokenizer import Tokenizer


class TokensPrompt(TypedDict, total=False):
    """A prompt given as token ids (with its text, if known)."""

    prompt_token_ids: list[int]
    prompt: str


Prompt = str | TokensPrompt
Conversation = list[dict[str, Any]]


class LLM:
    """One engine for offline work; `LLM(model)` takes what `zeroserve serve` takes."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        multiprocess_mode: bool | None = None,
        stats_log_interval_s: float | None = None,
        generation_config: dict[str, float] | None = None,
        **engine_settings: Any,
    ) -> None:
        """`engine_settings`: any of EngineConfig's fields (proto/engine_config.py), the names of
        `zeroserve serve`'s engine flags with underscores (`kv_cache_memory_gib` for
        `--kv-cache-memory`); `speculative_config` and `hf_overrides` also as dicts. A setting not
        given here is read from its ZEROSERVE_<FLAG> variable, as the commands read it."""
        resolved = resolve_model(model)
        settings = {**engine_settings_from_env(), **settings_from(engine_settings)}
        engine_config = EngineConfig(model_path=str(resolved.path), model_name=resolved.name, **settings)
        self._start(resolved, engine_config, multiprocess_mode, stats_log_interval_s, generation_config)

    @classmethod
    def from_engine_config(
        cls,
        model: str,
        engine_config: EngineConfig,
        *,
        multiprocess_mode: bool | None = None,
        stats_log_interval_s: float | None = None,
        generation_config: dict[str, float] | None = None,
    ) -> LLM:
        """An LLM whose engine takes `engine_config` whole (as `zeroserve serve` parses its flags),
        for `model` (a known name or a path)."""
        resolved = resolve_model(model)
        engine_config = replace(engine_config, model_path=str(resolved.path), model_name=resolved.name)
        llm = cls.__new__(cls)
        llm._start(resolved, engine_config, multiprocess_mode, stats_log_interval_s, generation_config)
        return llm

    def _start(
        self,
        resolved: ResolvedModel,
        engine_config: EngineConfig,
        multiprocess_mode: bool | None,
        stats_log_interval_s: float | None,
        generation_config: dict[str, float] | None,
    ) -> None:
        tokenizer = Tokenizer.from_model(resolved.path)
        self.llm_engine = LLMEngine(engine_config, tokenizer, multiprocess_mode, stats_log_interval_s)
        self.generation_defaults = {**resolved.generation_defaults, **(generation_config or {})}
        self._request_counter = itertools.count()

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams' defaults under the model's generation config (as vLLM's LLM does)."""
        return SamplingParams(**generation_defaults_of(self.generation_defaults))

    def get_tokenizer(self) -> Tokenizer:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Runs every prompt to completion; one RequestOutput per prompt, in input order."""
        prompt_list: list[Prompt] = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        params_list = self._params_for(len(prompt_list), sampling_params)
        request_ids = []
        try:
            for index, (prompt, params) in enumerate(zip(prompt_list, params_list, strict=True)):
                request_id = str(next(self._request_counter))
                if isinstance(prompt, str):
                    self.llm_engine.add_request(request_id, prompt, params, priority[index] if priority else 0)
                else:
                    self.llm_engine.add_request(
                        request_id, prompt["prompt_token_ids"], params,
                        priority[index] if priority else 0, prompt.get("prompt"),
                    )
                request_ids.append(request_id)
            finished = self._run_engine(len(request_ids), use_tqdm)
        except BaseException:
            self.llm_engine.abort_request(request_ids)
            raise
        return [finished[request_id] for request_id in request_ids]

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Renders each conversation with the model's chat template, then generates."""
        is_one = bool(messages) and isinstance(messages[0], dict)
        conversations = [cast(Conversation, messages)] if is_one else list(cast(Sequence[Conversation], messages))
        prompts: list[Prompt] = []
        for conversation in conversations:
            token_ids, text = self.llm_engine.input_processor.chat_prompt(
                conversation, add_generation_prompt, continue_final_message, **(chat_template_kwargs or {})
            )
            prompts.append(TokensPrompt(prompt_token_ids=token_ids, prompt=text or ""))
        return self.generate(prompts, sampling_params, use_tqdm)

    def _params_for(
        self, num_prompts: int, sampling_params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * num_prompts
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * num_prompts
        if len(sampling_params) != num_prompts:
            raise ValueError(
                f"got {len(sampling_params)} sampling params for {num_prompts} prompts: give one, or one per prompt"
            )
        return list(sampling_params)

    def _run_engine(self, num_requests: int, use_tqdm: bool) -> dict[str, RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        running: dict[str, RequestOutput] = {}
        bar = tqdm(total=num_requests, desc="Processed prompts", unit="req", disable=not use_tqdm, dynamic_ncols=True)
        started = time.perf_counter()
        num_prompt_tokens = num_output_tokens = 0
        with bar:
            while self.llm_engine.has_unfinished_requests():
                for delta in self.llm_engine.step():
                    num_output_tokens += len(delta.outputs[0].token_ids)
                    output = accumulate(running, delta)
                    if output.finished:
                        finished[output.request_id] = running.pop(output.request_id)
                        num_prompt_tokens += len(output.prompt_token_ids)
                        elapsed = time.perf_counter() - started
                        bar.set_postfix_str(
                            f"est. speed input: {num_prompt_tokens / elapsed:.1f} toks/s, "
                            f"output: {num_output_tokens / elapsed:.1f} toks/s",
                            refresh=False,
                        )
                        bar.update(1)
        return finished

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Frees the KV cache (level 1) or it and the weights (level 2) until `wake_up()`."""
        self.llm_engine.sleep(level)

    def wake_up(self) -> None:
        self.llm_engine.wake_up()

    def get_stats(self) -> SchedulerStats:
        """The engine's state now: requests running and waiting, KV cache, prefix cache, drafts."""
        return self.llm_engine.get_stats()

    def shutdown(self) -> None:
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()
