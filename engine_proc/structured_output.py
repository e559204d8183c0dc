"""Structured outputs: each constrained request's grammar (xgrammar or llguidance: see
grammar_backends.py), compiled off the busy loop in a worker thread with a cache by grammar, then
a token mask per step and a matcher advanced by each sampled token."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from engine_proc.grammar_backends import GrammarBackend, Matcher, make_backend
from proto.engine_input import StructuredOutput

logger = logging.getLogger(__name__)


class RequestGrammar:
    """One request's grammar: pending while it compiles, then a matcher over its output (over what
    follows its reasoning, for a reasoning model's request)."""

    def __init__(
        self, compiled: Future[Any], make_matcher: Callable[[Any], Matcher], timeout_s: float = math.inf,
        spec: StructuredOutput | None = None,
    ) -> None:
        self._compiled = compiled
        self._make_matcher = make_matcher
        # NOTE: "open": the first token may open reasoning (or starts the constrained output);
        # "reasoning": unconstrained until the end tag; "constrained": every token matches.
        self._start_ids = [] if spec is None else list(spec.reasoning_start_ids)
        self._end_ids = [] if spec is None else list(spec.reasoning_end_ids)
        self._phase = "constrained"
        if self._end_ids:
            self._phase = "reasoning" if spec is not None and spec.is_reasoning else "open"
            if self._phase == "open" and len(self._start_ids) != 1:
                self._phase = "constrained"
        self._reasoning_tail: list[int] = []
        self._deadline = time.monotonic() + timeout_s
        self._timeout_s = timeout_s
        self._is_timed_out = False
        self._matcher: Matcher | None = None

    @property
    def is_ready(self) -> bool:
        """Compiled, failed, or past its time (then `error` says so)."""
        return self._is_timed_out or self._compiled.done()

    def check_deadline(self) -> None:
        """Gives up on a grammar still compiling past its time (the compile itself runs on)."""
        if not self._compiled.done() and time.monotonic() > self._deadline:
            self._is_timed_out = True

    @property
    def error(self) -> str | None:
        """Why the grammar cannot be used (once ready), or None."""
        if self._is_timed_out:
            return (f"the structured output's grammar did not compile within {self._timeout_s:g} s "
                    "(--structured-outputs-config compile_timeout_s)")
        if not self._compiled.done() or self._compiled.exception() is None:
            return None
        return f"the structured output's grammar did not compile: {self._compiled.exception()}"

    @property
    def matcher(self) -> Matcher:
        if self._matcher is None:
            self._matcher = self._make_matcher(self._compiled.result())
        return self._matcher

    @property
    def is_constraining(self) -> bool:
        """Whether the next token is masked (not while reasoning)."""
        return self._phase != "reasoning"

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_bitmask(bitmask, row)
        if self._phase == "open":
            (start,) = self._start_ids
            word = int(bitmask[row, start // 32]) | (1 << (start % 32))
            bitmask[row, start // 32] = word - (1 << 32) if word >= 1 << 31 else word

    @property
    def is_drafting_allowed(self) -> bool:
        """Whether draft tokens can be checked against it (while constraining, not around reasoning)."""
        return self._phase == "constrained" and self.is_ready and self.error is None and not self.is_terminated

    def num_valid_drafts(self, draft_ids: tuple[int, ...]) -> int:
        """How many of the drafts, in order, the grammar allows (its state unchanged)."""
        num_valid = self.matcher.accept_prefix(list(draft_ids))
        self.matcher.rollback(num_valid)
        return num_valid

    def fill_bitmasks(self, bitmask: torch.Tensor, rows: list[int], draft_ids: tuple[int, ...]) -> None:
        """The masks of a request's rows: the next token's, then each draft's next as if the drafts
        before it were accepted (rows past a draft the grammar refuses stay all allowed: the
        verification stops at that draft anyway)."""
        self.fill_bitmask(bitmask, rows[0])
        num_accepted = 0
        for row, draft_id in zip(rows[1:], draft_ids, strict=False):
            if self.matcher.accept_prefix([draft_id]) != 1:
                break
            num_accepted += 1
            if self.matcher.is_terminated():
                break
            self.matcher.fill_bitmask(bitmask, row)
        self.matcher.rollback(num_accepted)

    def accept(self, token_id: int) -> None:
        if self._phase == "open":
            self._phase = "reasoning" if token_id == self._start_ids[0] else "constrained"
        if self._phase == "reasoning":
            self._reasoning_tail = (self._reasoning_tail + [token_id])[-len(self._end_ids):]
            if self._reasoning_tail == self._end_ids:
                self._phase = "constrained"
            return
        # NOTE: a token the mask allowed is always accepted; a stop token ends the matcher.
        if not self.matcher.is_terminated() and not self.matcher.accept(token_id):
            logger.warning("structured output: token %d does not match the grammar", token_id)

    @property
    def is_terminated(self) -> bool:
        return self._phase == "constrained" and self._matcher is not None and self._matcher.is_terminated()


class StructuredOutputManager:
    """Compiles grammars for an engine's model with its backend (the vocabulary read on the first compile)."""

    def __init__(
        self, model_path: str, vocab_size: int, eos_token_ids: tuple[int, ...], compile_timeout_s: float = math.inf,
        backend: str = "auto",
    ) -> None:
        self.model_path = model_path
        self.backend_name = backend
        self.compile_timeout_s = compile_timeout_s
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._backend: GrammarBackend | None = None
        self._backend_lock = threading.Lock()
        self._bitmask: torch.Tensor | None = None

    def grammar_for(self, spec: StructuredOutput) -> RequestGrammar:
        """Starts compiling (a cache hit returns at once) and returns the pending grammar."""
        return RequestGrammar(self._executor.submit(self._compile, spec), self._matcher, self.compile_timeout_s, spec)

    def bitmask(self, num_rows: int) -> torch.Tensor:
        """A reused [num_rows, vocab/32] int32 mask, every token allowed."""
        import xgrammar

        if self._bitmask is None or self._bitmask.shape[0] < num_rows:
            self._bitmask = xgrammar.allocate_token_bitmask(max(num_rows, 16), self.vocab_size)
        bitmask = self._bitmask[:num_rows]
        bitmask.fill_(-1)
        return bitmask

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        """Masked float32 logits (the disallowed tokens at -inf)."""
        import xgrammar

        logits = logits.float().contiguous()
        xgrammar.apply_token_bitmask_inplace(logits, bitmask.to(logits.device))
        return logits

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _compile(self, spec: StructuredOutput) -> Any:
        return self._get_backend().compile(spec)

    def _matcher(self, compiled: Any) -> Matcher:
        return self._get_backend().matcher(compiled)

    def _get_backend(self) -> GrammarBackend:
        with self._backend_lock:
            if self._backend is None:
                self._backend = make_backend(
                    self.backend_name, self.model_path, self.vocab_size, list(self.eos_token_ids)
                )
            return self._backend
