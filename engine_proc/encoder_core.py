"""EncoderCore: an encoder's engine (vLLM's pooling runner): each step embeds or scores the waiting texts
that fit its token budget, in one forward, and answers each with its vector; no KV cache is kept."""

from __future__ import annotations

import collections
import logging
import socket
import time
import uuid
from typing import Any

import numpy as np
import torch

from engine_proc.cpu.features import cpu_features, cpu_model_name
from engine_proc.loader import TORCH_DTYPES
from engine_proc.loader.encoder_loader import load_encoder
from engine_proc.memory_report import committed_memory_bytes, device_name, resident_bytes, tensor_bytes
from engine_proc.model_runner import resolve_device
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, UtilityCall
from proto.engine_output import EngineCoreOutput, EngineCoreOutputs, FinishReason, SchedulerStats, UtilityResult
from proto.handshake import EngineReady

logger = logging.getLogger(__name__)


class EncoderCore:
    """Admits pooling requests, runs them in batches, and reports each one's vector (EngineCore's interface)."""

    def __init__(self, config: EngineConfig, engine_index: int = 0) -> None:
        self.config = config
        self.engine_index = engine_index
        started = time.monotonic()
        self.runtime_bytes = resident_bytes()
        if config.num_threads is not None:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)
        self.dtype = TORCH_DTYPES[config.dtype] or _auto_dtype(self.device)
        self.model, self.pooling = load_encoder(config.model_path, self.dtype, self.device)
        model_config = self.model.config
        limits = [model_config.max_position_embeddings, self.pooling.max_seq_length, config.max_model_len]
        self.max_model_len = min(limit for limit in limits if limit)
        self.waiting: collections.deque[EngineCoreRequest] = collections.deque()
        self._rejected: list[EngineCoreOutput] = []
        self.suspect_request_ids: list[str] = []
        self.instance_id = uuid.uuid4().hex
        self.num_steps = 0
        name = "engine" if engine_index < 0 else f"engine {engine_index}"
        logger.info("%s ready in %.1fs: an encoder (%s pooling), max_model_len %d", name,
                    time.monotonic() - started, self.pooling.method, self.max_model_len)

    def ready_message(self) -> EngineReady:
        device = device_name(self.device)
        ready = EngineReady(
            engine_index=self.engine_index, model_name=self.config.model_name, max_model_len=self.max_model_len,
            vocab_size=self.model.config.vocab_size, host=socket.gethostname(),
            cpu=f"{cpu_model_name()}, torch {cpu_features().describe()}",
            kernel_choices={"encoder": f"torch {str(self.dtype).removeprefix('torch.')}, {self.pooling.method} pooling"},
            instance_id=self.instance_id,
            device=device, weight_bytes=tensor_bytes([*self.model.parameters()]),
            runtime_bytes=0 if device.startswith("cuda") else self.runtime_bytes, runner="pooling",
            pooling_tasks=["embed", "score"] if self.model.classifier is not None else ["embed"],
        )
        ready.memory_bytes = committed_memory_bytes(ready)
        return ready

    def set_engine_index(self, engine_index: int) -> None:
        self.engine_index = engine_index

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self._rejected)

    def add_request(self, request: EngineCoreRequest) -> None:
        problem = self._invalid(request)
        if problem is not None:
            logger.warning("rejecting request %s: %s", request.request_id, problem)
            self._rejected.append(EngineCoreOutput(request.request_id, [], FinishReason.ERROR, problem))
            return
        self.waiting.append(request)

    def _invalid(self, request: EngineCoreRequest) -> str | None:
        """Why this engine cannot run the request, or None."""
        params, num_tokens = request.pooling_params, len(request.prompt_token_ids)
        if params is None:
            return "this model embeds and scores texts; it does not generate"
        if num_tokens == 0 or num_tokens > self.max_model_len:
            return f"invalid prompt length ({num_tokens} tokens; this model takes 1 to {self.max_model_len})"
        if min(request.prompt_token_ids) < 0 or max(request.prompt_token_ids) >= self.model.config.vocab_size:
            return f"a token id outside the vocabulary (0 to {self.model.config.vocab_size - 1})"
        if request.token_type_ids is not None and len(request.token_type_ids) != num_tokens:
            return "token_type_ids must have one entry per prompt token"
        if params.task == "score" and self.model.classifier is None:
            return "this model embeds texts; it has no classifier to score pairs with"
        if params.task == "embed" and params.dimensions is not None and params.dimensions > self.model.config.hidden_size:
            return f"dimensions {params.dimensions} exceeds the model's {self.model.config.hidden_size}"
        return None

    def abort_requests(self, request_ids: list[str]) -> None:
        aborted = set(request_ids)
        self.waiting = collections.deque(r for r in self.waiting if r.request_id not in aborted)

    def step(self) -> EngineCoreOutputs:
        """Take the waiting texts that fit the token budget → one forward → each text's vector."""
        outputs, self._rejected = self._rejected, []
        batch = self._take_batch()
        self.suspect_request_ids = [request.request_id for request in batch]
        if batch:
            outputs += self._run(batch)
            self.num_steps += 1
        self.suspect_request_ids = []
        return self.idle_outputs(outputs)

    def _take_batch(self) -> list[EngineCoreRequest]:
        """The first waiting texts whose tokens fit in one step's budget (at least the first)."""
        batch: list[EngineCoreRequest] = []
        budget = self.config.max_num_batched_tokens
        while self.waiting and (not batch or len(self.waiting[0].prompt_token_ids) <= budget):
            request = self.waiting.popleft()
            budget -= len(request.prompt_token_ids)
            batch.append(request)
        return batch

    @torch.inference_mode()
    def _run(self, batch: list[EngineCoreRequest]) -> list[EngineCoreOutput]:
        seq_lens = [len(request.prompt_token_ids) for request in batch]
        input_ids = torch.tensor([token for request in batch for token in request.prompt_token_ids], device=self.device)
        positions = torch.cat([torch.arange(num_tokens, device=self.device) for num_tokens in seq_lens])
        token_type_ids = torch.tensor(
            [token for request in batch for token in (request.token_type_ids or [0] * len(request.prompt_token_ids))],
            device=self.device,
        )
        hidden = self.model(input_ids, positions, token_type_ids, seq_lens)
        vectors = self.pooling.pool(hidden, seq_lens)
        first_rows = torch.tensor(np.cumsum([0, *seq_lens[:-1]]), device=self.device)
        is_scoring = any(request.pooling_params is not None and request.pooling_params.task == "score" for request in batch)
        scores = self.model.classify(hidden[first_rows]).float() if is_scoring else None
        outputs = []
        for row, request in enumerate(batch):
            params = request.pooling_params
            assert params is not None
            if params.task == "score":
                assert scores is not None
                pooled = scores[row]
            else:
                pooled = vectors[row]
                if params.dimensions is not None:
                    # NOTE: Matryoshka: the first dimensions, then unit length again where the model's vectors are.
                    pooled = pooled[: params.dimensions]
                    if self.pooling.is_normalized:
                        pooled = torch.nn.functional.normalize(pooled, dim=0)
            outputs.append(EngineCoreOutput(
                request.request_id, [], FinishReason.STOP, pooled=pooled.cpu().numpy().astype(np.float32),
            ))
        return outputs

    def idle_outputs(self, outputs: list[EngineCoreOutput] | None = None) -> EngineCoreOutputs:
        return EngineCoreOutputs(
            engine_index=self.engine_index, outputs=outputs or [], timestamp=time.time(),
            scheduler_stats=self.get_stats(),
        )

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(num_waiting_reqs=len(self.waiting))

    def call_utility(self, call: UtilityCall) -> UtilityResult:
        utilities: dict[str, Any] = {"ping": lambda: "pong", "get_stats": self.get_stats, "is_sleeping": lambda: False,
                                     "reset_prefix_cache": lambda: True}
        method = utilities.get(call.method)
        if method is None:
            return UtilityResult(call.call_id, error=f"{call.method!r} is not available on an encoder")
        try:
            return UtilityResult(call.call_id, result=method(*call.args))
        except Exception as exc:  # noqa: BLE001 - the error goes back to the caller
            return UtilityResult(call.call_id, error=f"{type(exc).__name__}: {exc}")

    def shutdown(self) -> None:
        """Nothing held beyond the model, which goes with this object."""


def _auto_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where the device multiplies it natively (AVX-512 BF16 or AMX, a CUDA GPU that has it): all-MiniLM-L6-v2's
    vectors stay within cosine 0.9999 of sentence-transformers' float32 ones at about 2.5 times the speed (Zen 5);
    float32 elsewhere, where bfloat16 would be emulated and slower."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    features = cpu_features()
    return torch.bfloat16 if features.has_avx512_bf16 or features.has_amx else torch.float32
