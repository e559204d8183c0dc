"""Runs one forward over a step's flat batch and samples the next tokens."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from engine_proc.attention import AttentionMetadata, PagedAttention, PrefillSpan, decode_query_grid
from engine_proc.cpu.features import cpu_features, cpu_model_name
from engine_proc.kv_cache_memory import num_kv_blocks, release_memory
from engine_proc.loader import TORCH_DTYPES, load_model
from engine_proc.models.llama import LlamaForCausalLM
from engine_proc.penalties import TokenCounts
from engine_proc.prompt_logprobs import PromptLogprobs
from engine_proc.request import Request
from engine_proc.sampler import Sampler, SamplerOutput
from engine_proc.sampling_metadata import SamplingMetadata
from engine_proc.scheduler import ScheduledRequest, SchedulerOutput
from engine_proc.structured_output import StructuredOutputManager
from proto.engine_config import EngineConfig
from proto.engine_output import Logprobs


class ModelRunnerOutput(NamedTuple):
    """The new token ids of each sampling request, in scheduler order, and the logprobs of those that asked.

    A request without drafts gets one id; one with drafts gets the drafts the model agreed
    with, then the model's own next token.
    """

    sampled_token_ids: list[list[int]]
    logprobs: dict[str, Logprobs]
    prompt_logprobs: dict[str, Logprobs]


class ModelRunner:
    """Owns the model, its KV cache and the sampler; turns a SchedulerOutput into token ids."""

    def __init__(self, config: EngineConfig) -> None:
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = resolve_device(config.device)
        self.dtype = TORCH_DTYPES[config.dtype]
        self.block_size = config.block_size
        self.config = config
        self.model = self._load_model()
        # NOTE: the load's freed temporaries (blocks read, converted and packed) handed back before the KV
        # cache's share of free memory is taken: glibc kept 4.8 GB of them for a 5.7 GB gpt-oss-shaped file.
        release_memory(self.device)
        self.dtype = self.model.lm_head_weight.dtype
        self.sleep_level = 0
        self.model_config = self.model.config
        mc = self.model_config
        bytes_per_block = (
            2 * mc.num_hidden_layers * config.block_size * mc.num_key_value_heads * mc.head_dim
            * self.dtype.itemsize
        )
        self.num_kv_blocks = num_kv_blocks(config.kv_cache_memory_gib, bytes_per_block, self.device)
        self.attention = PagedAttention(
            mc.num_hidden_layers,
            self.num_kv_blocks * config.block_size,
            mc.num_key_value_heads,
            mc.head_dim,
            config.block_size,
            self.dtype,
            self.device,
        )
        self.sampler = Sampler()
        # NOTE: set by the engine core with its first constrained request.
        self.structured_output: StructuredOutputManager | None = None
        self._generators: dict[str, torch.Generator] = {}
        self.prompt_logprobs = PromptLogprobs()
        self.token_counts = TokenCounts(self.model_config.vocab_size, self.device)

    @property
    def kernel_choices(self) -> dict[str, str]:
        """What runs each piece of a step here (measured or detected at load), and whether a row's
        tokens depend on its own context alone."""
        return {**self.model.choices, "attention": self.attention.choice, "batch invariant": self.batch_invariance}

    @property
    def batch_invariance(self) -> str:
        """"yes", or "no (why)": whether every piece of a step computes each row on its own, in an
        order no other row changes (the sampler does: each row's draw is its own)."""
        if not self.config.batch_invariant:
            return "no (--no-batch-invariant)"
        missing = [
            piece for piece, is_invariant in (
                ("matmuls and norms", self.model.is_batch_invariant), ("attention", self.attention.is_row_invariant),
            ) if not is_invariant
        ]
        return f"no ({' and '.join(missing)} without a row-invariant kernel here)" if missing else "yes"

    @property
    def device_description(self) -> str:
        if self.device.type == "cuda":
            return torch.cuda.get_device_name(self.device)
        return f"{cpu_model_name()}, torch {cpu_features().describe()}"

    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """Runs the step's forward and samples a token for each request that reached its end.

        A request with drafts is scored at its last token and at each draft (greedy): the
        drafts stand up to the first that differs from the model's pick there.
        """
        # NOTE: decodes (one token, or one and its drafts) first, so their attention is one batched call.
        order = sorted(scheduler_output.scheduled, key=lambda s: not _is_decode(s))
        input_ids, positions, metadata = self._prepare_inputs(order)
        self.attention.metadata = metadata
        hidden = self.model(input_ids, positions, self.attention)
        self.attention.metadata = None
        self.prompt_logprobs.update(order, hidden, self.model.compute_logits)

        end_index, last_rows = 0, {}
        for scheduled in order:
            end_index += scheduled.num_new_tokens
            if scheduled.is_sampling:
                last_rows[id(scheduled)] = end_index - 1
        sampling_order = [s for s in scheduler_output.scheduled if s.is_sampling]
        if not sampling_order:
            return ModelRunnerOutput([], {}, {})
        rows: list[int] = []
        row_requests: list[Request] = []
        constrained: list[tuple[int, ScheduledRequest]] = []  # (first row, request) of the masked ones
        for scheduled in sampling_order:
            grammar = scheduled.request.grammar
            if grammar is not None and grammar.is_constraining:
                constrained.append((len(rows), scheduled))
            num_rows = 1 + len(scheduled.spec_token_ids)
            rows.extend(range(last_rows[id(scheduled)] - num_rows + 1, last_rows[id(scheduled)] + 1))
            row_requests.extend([scheduled.request] * num_rows)
        sampled_hidden = hidden[torch.tensor(rows, device=self.device)]
        metadata = self._sampling_metadata(row_requests, self.model_config.vocab_size)
        greedy_ids = (
            self.model.compute_greedy_ids(sampled_hidden)
            if metadata.is_plain_greedy and metadata.banned is None and not constrained else None
        )
        if greedy_ids is not None:
            sampler_output = SamplerOutput(greedy_ids, None, None, None)
        else:
            logits = self.model.compute_raw_logits(sampled_hidden)
            if constrained:
                logits = self._masked(logits, len(row_requests), constrained)
            sampler_output = self.sampler(logits, metadata)
        sampled_token_ids = _accepted(sampling_order, sampler_output.token_ids.tolist())
        requests = [s.request for s in sampling_order]
        prompt_logprobs = {r.request_id: self.prompt_logprobs.pop(r.request_id) for r in requests}
        return ModelRunnerOutput(
            sampled_token_ids,
            _logprobs_by_request(row_requests, sampler_output),
            {request_id: lp for request_id, lp in prompt_logprobs.items() if lp is not None},
        )

    def _masked(
        self, logits: torch.Tensor, num_rows: int, constrained: list[tuple[int, ScheduledRequest]]
    ) -> torch.Tensor:
        """The logits with each constrained row's disallowed tokens at -inf (its grammar's mask,
        draft rows' as if the drafts before them were accepted)."""
        assert self.structured_output is not None
        bitmask = self.structured_output.bitmask(num_rows)
        for first_row, scheduled in constrained:
            rows = list(range(first_row, first_row + 1 + len(scheduled.spec_token_ids)))
            scheduled.request.grammar.fill_bitmasks(bitmask, rows, scheduled.spec_token_ids)
        return self.structured_output.apply_bitmask(logits, bitmask)

    def _sampling_metadata(self, requests: list[Request], vocab_size: int) -> SamplingMetadata:
        generators = {}
        for row, request in enumerate(requests):
            generator = self._generator_for(request)
            if generator is not None:
                generators[row] = generator
        return SamplingMetadata.build(
            [r.sampling_params for r in requests],
            [_banned_ids(r) for r in requests],
            generators,
            vocab_size,
            self.device,
            output_counts=lambda: self.token_counts.output_counts(requests),
            prompt_mask=lambda: self.token_counts.prompt_mask(requests),
        )

    def sleep(self, level: int) -> None:
        """Frees the KV cache and, at level 2, the weights too (reloaded on wake-up)."""
        self.attention.free_cache()
        if level >= 2:
            self.model.unpack()
            self.model.to_empty(device="meta")
        self.sleep_level = max(self.sleep_level, level)
        release_memory(self.device)

    def wake_up(self) -> None:
        if self.sleep_level >= 2:
            self.model = self._load_model()
        if self.sleep_level >= 1:
            self.attention.allocate_cache()
        self.sleep_level = 0

    def _load_model(self) -> LlamaForCausalLM:
        config = self.config
        return load_model(
            config.model_path, dtype=self.dtype, device=self.device, quantization=config.quantization,
            load_format=config.load_format, hf_overrides=config.hf_overrides_dict, batch_invariant=config.batch_invariant,
        )

    def free_request(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
        self.prompt_logprobs.pop(request_id)
        self.token_counts.free(request_id)

    def _generator_for(self, request: Request) -> torch.Generator | None:
        seed = request.sampling_params.seed
        if seed is None or request.sampling_params.is_greedy:
            return None
        generator = self._generators.get(request.request_id)
        if generator is None:
            generator = torch.Generator(device=self.device)
            self._generators[request.request_id] = generator
        # NOTE: the draw at each output position follows from the seed and the position alone, so
        # a request resumed on another engine (or recomputed after a preemption) draws the same.
        return generator.manual_seed(_seed_at(seed, request.num_output_tokens))

    def _prepare_inputs(
        self, order: list[ScheduledRequest]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """The flat batch (decodes first), its positions and where its tokens go in the cache.

        A decode costs O(its blocks) here, not O(its context): its new tokens' slots and its
        block table row are all attention needs.
        """
        block_size = self.block_size
        token_ids: list[int] = []
        decode_positions: list[int] = []
        decode_slots: list[int] = []
        decode_blocks: list[list[int]] = []
        decode_query_lens: list[int] = []
        prefill_positions: list[np.ndarray] = []
        prefill_slots: list[np.ndarray] = []
        prefills: list[PrefillSpan] = []
        for scheduled in order:
            request, num_new, spec_token_ids = scheduled
            start = request.num_computed_tokens
            end = start + num_new
            if _is_decode(scheduled):
                token_ids.append(request.all_token_ids[start])
                token_ids.extend(spec_token_ids)
                for position in range(start, end):
                    block_index, offset = divmod(position, block_size)
                    decode_positions.append(position)
                    decode_slots.append(request.block_ids[block_index] * block_size + offset)
                decode_blocks.append(request.block_ids[: (end - 1) // block_size + 1])
                decode_query_lens.append(num_new)
                continue
            block_ids = np.asarray(request.block_ids[: -(-end // block_size)], dtype=np.int64)
            positions = np.arange(start, end)
            token_ids.extend(request.all_token_ids[start:end])
            prefill_positions.append(positions)
            prefill_slots.append(block_ids[positions // block_size] * block_size + positions % block_size)
            mask = None
            if start > 0:
                mask = torch.from_numpy(np.arange(end)[None, :] <= positions[:, None]).to(self.device)
            prefills.append(
                PrefillSpan(len(token_ids) - num_new, num_new, end, self._to_device(block_ids), mask)
            )
        block_table, decode_lens = self._block_table(decode_blocks, decode_positions, decode_query_lens)
        metadata = AttentionMetadata(
            slot_mapping=self._to_device(np.concatenate([np.array(decode_slots, dtype=np.int64), *prefill_slots])),
            num_decodes=len(decode_blocks),
            decode_block_table=block_table,
            decode_lens=decode_lens,
            prefills=prefills,
            num_decode_tokens=len(decode_positions),
        )
        if decode_query_lens and max(decode_query_lens) > 1:
            self._add_query_grid(metadata, decode_positions, decode_query_lens)
        input_ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)
        positions = np.concatenate([np.array(decode_positions, dtype=np.int64), *prefill_positions])
        return input_ids, self._to_device(positions), metadata

    def _block_table(
        self, decode_blocks: list[list[int]], decode_positions: list[int], decode_query_lens: list[int]
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """[num_decodes, max_blocks] block ids (padded with block 0) and [num_decodes] context lengths."""
        if not decode_blocks:
            return None, None
        table = np.zeros((len(decode_blocks), max(len(blocks) for blocks in decode_blocks)), dtype=np.int64)
        for row, blocks in enumerate(decode_blocks):
            table[row, : len(blocks)] = blocks
        last_index = np.cumsum(decode_query_lens) - 1
        return self._to_device(table), self._to_device(np.array(decode_positions, dtype=np.int64)[last_index] + 1)

    def _add_query_grid(
        self, metadata: AttentionMetadata, decode_positions: list[int], decode_query_lens: list[int]
    ) -> None:
        """Lays the decodes' tokens out as a [num_decodes, max_query_len] grid (see AttentionMetadata)."""
        query_positions, pad_index, unpad_index = decode_query_grid(
            np.array(decode_positions, dtype=np.int64), np.array(decode_query_lens, dtype=np.int64)
        )
        metadata.decode_query_positions = self._to_device(query_positions)
        if pad_index is not None and unpad_index is not None:
            metadata.decode_pad_index = self._to_device(pad_index)
            metadata.decode_unpad_index = self._to_device(unpad_index)

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)


def resolve_device(device: str) -> torch.device:
    """`device`, with "auto" as CUDA where torch sees a GPU, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _accepted(sampling_order: list[ScheduledRequest], token_ids: list[int]) -> list[list[int]]:
    """Each request's new tokens from the picks at its rows: its drafts up to the first the model
    did not pick, then the model's pick there."""
    sampled_token_ids, row = [], 0
    for scheduled in sampling_order:
        picks = token_ids[row : row + 1 + len(scheduled.spec_token_ids)]
        row += len(picks)
        num_accepted = 0
        for draft, pick in zip(scheduled.spec_token_ids, picks, strict=False):
            if draft != pick:
                break
            num_accepted += 1
        sampled_token_ids.append(picks[: num_accepted + 1])
    return sampled_token_ids


def _is_decode(scheduled: ScheduledRequest) -> bool:
    """One new token, or the last known token and its drafts: attention in the batched decode path."""
    return scheduled.num_new_tokens == 1 or bool(scheduled.spec_token_ids)


def _banned_ids(request: Request) -> list[int]:
    """The ids that would end the request before its min_tokens."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens:
        return []
    eos_ids = [] if params.ignore_eos else list(request.eos_token_ids)
    return eos_ids + list(params.stop_token_ids)


def _logprobs_by_request(requests: list[Request], output: SamplerOutput) -> dict[str, Logprobs]:
    if output.logprobs is None:
        return {}
    assert output.logprob_token_ids is not None and output.ranks is not None
    token_ids, logprobs, ranks = output.logprob_token_ids.tolist(), output.logprobs.tolist(), output.ranks.tolist()
    by_request = {}
    for row, request in enumerate(requests):
        num_top = request.sampling_params.num_logprobs
        if num_top is not None:
            by_request[request.request_id] = Logprobs(
                [token_ids[row][: 1 + num_top]], [logprobs[row][: 1 + num_top]], [ranks[row]]
            )
    return by_request


def _seed_at(seed: int, position: int) -> int:
    """A seeded request's generator seed for its sample at output `position` (a 64-bit mix)."""
    return (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % 2**64
