"""The engine's state for one request."""

from __future__ import annotations

import enum
import time
from typing import Any

import numpy as np

from proto.engine_input import EngineCoreRequest, SamplingParams
from proto.engine_output import EngineCoreEvent, EngineCoreEventType, FinishReason


class RequestStatus(enum.Enum):
    """Where a request is in the scheduler."""

    WAITING = enum.auto()
    RUNNING = enum.auto()
    FINISHED = enum.auto()


class Request:
    """One sequence: its tokens, how many have K/V in the cache, and its blocks."""

    def __init__(self, core_request: EngineCoreRequest, eos_token_ids: tuple[int, ...]) -> None:
        self.request_id = core_request.request_id
        self.prompt_token_ids = list(core_request.prompt_token_ids)
        self.sampling_params: SamplingParams = core_request.sampling_params
        self.arrival_time = core_request.arrival_time
        self.priority = core_request.priority
        self.client_index = core_request.client_index
        self.eos_token_ids = eos_token_ids
        self.output_token_ids: list[int] = list(core_request.resumed_token_ids)
        self.all_token_ids = self.prompt_token_ids + self.output_token_ids
        # NOTE: the same ids as an array (grown by doubling) for the n-gram drafter's lookups;
        # made on the first lookup, so engines that do not draft never keep it.
        self._token_buffer: np.ndarray | None = None
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        # NOTE: chained hashes of the full blocks of `all_token_ids`, kept across preemptions.
        self.block_hashes: list[bytes] = []
        self.num_cached_tokens = 0
        self.status = RequestStatus.WAITING
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0
        # NOTE: running mean of the share of its draft tokens the model accepted (drafting starts hopeful).
        self.draft_acceptance = 1.0
        # NOTE: how many drafts it may have next step (the scheduler starts it at its maximum).
        self.num_draft_slots = 0
        # NOTE: scheduling events not yet sent; they ride on the request's next output.
        self.events: list[EngineCoreEvent] = []
        # NOTE: a constrained request's grammar (engine_proc/structured_output.py's RequestGrammar):
        # it waits until compiled; each sampled token advances it.
        self.grammar: Any = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def token_array(self) -> np.ndarray:
        """`all_token_ids` as an int64 array (a view: valid until the next appended token)."""
        num_tokens = len(self.all_token_ids)
        if self._token_buffer is None:
            self._token_buffer = np.zeros(max(64, 2 * num_tokens), dtype=np.int64)
            self._token_buffer[:num_tokens] = self.all_token_ids
        return self._token_buffer[:num_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    @property
    def sort_key(self) -> tuple[int, float]:
        """Priority order: lower `priority` first, then earlier arrival."""
        return self.priority, self.arrival_time

    def record_event(self, event_type: EngineCoreEventType) -> None:
        self.events.append(EngineCoreEvent(event_type, time.time()))

    def take_events(self) -> list[EngineCoreEvent] | None:
        """The events since the last call, or None when there were none."""
        if not self.events:
            return None
        events, self.events = self.events, []
        return events

    def append_output_token(self, token_id: int) -> None:
        if self._token_buffer is not None:
            num_tokens = len(self.all_token_ids)
            if num_tokens == self._token_buffer.shape[0]:
                self._token_buffer = np.concatenate((self._token_buffer, np.zeros_like(self._token_buffer)))
            self._token_buffer[num_tokens] = token_id
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)
        if self.grammar is not None:
            self.grammar.accept(token_id)

    @property
    def is_waiting_for_grammar(self) -> bool:
        return self.grammar is not None and not self.grammar.is_ready

    def check_stop(self, max_model_len: int) -> bool:
        """Sets the finish reason if the last token ends the request."""
        params = self.sampling_params
        last = self.output_token_ids[-1]
        if not params.ignore_eos and last in self.eos_token_ids:
            self.finish_reason = FinishReason.STOP
        elif last in params.stop_token_ids:
            self.finish_reason, self.stop_reason = FinishReason.STOP, last
        elif self.grammar is not None and self.grammar.is_terminated:
            self.finish_reason = FinishReason.STOP
        elif self.num_output_tokens >= params.max_tokens or self.num_tokens >= max_model_len:
            self.finish_reason = FinishReason.LENGTH
        return self.finish_reason is not None
