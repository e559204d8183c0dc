"""`zeroserve generate`: a JSONL file of OpenAI request bodies → a JSONL file of results.

Each input line is a completions or chat request body (or an OpenAI batch line,
`{"custom_id", "url", "body"}`); each output line is that line's result, in input order:
`{"id", "custom_id", "line", "response": {"status_code", "body"}, "error"}` as OpenAI's batch
output reads. Results are flushed line by line, so a rerun skips the lines already written.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from proto.engine_input import SamplingParams
from service.frontend.input_processor import PromptTooLongError
from service.frontend.llm_engine import LLMEngine
from service.frontend.outputs import CompletionOutput, RequestOutput, accumulate
from service.openai.errors import APIError, validate_body
from service.openai.logprobs_format import chat_logprobs, completion_logprobs
from service.openai.protocol import ChatCompletionRequest, CompletionRequest
from service.openai.request_fields import build_sampling_params, now, usage

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
DEFAULT_MAX_IN_FLIGHT = 256


@dataclass
class BatchJob:
    """One input line in flight: its prompts' requests and their outputs so far."""

    index: int
    custom_id: str | None
    body: ChatCompletionRequest | CompletionRequest
    request_ids: list[str]
    prompts: list[str]
    num_prompt_tokens: int
    outputs: dict[str, RequestOutput] = field(default_factory=dict)
    num_finished: int = 0

    @property
    def is_done(self) -> bool:
        return self.num_finished == len(self.request_ids)


@dataclass
class _RunState:
    """One run's lines in flight, results waiting for their turn in the output, and counts."""

    next_index: int
    num_written: int = 0
    jobs: dict[int, BatchJob] = field(default_factory=dict)
    by_request: dict[str, BatchJob] = field(default_factory=dict)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)


class BatchRunner:
    """Feeds a file's requests to an LLMEngine, a window at a time, and writes results in order."""

    def __init__(
        self,
        engine: LLMEngine,
        model_name: str,
        generation_defaults: dict[str, float],
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_n: int = 16,
    ) -> None:
        self.engine = engine
        self.model_name = model_name
        self.generation_defaults = generation_defaults
        self.max_in_flight = max_in_flight
        self.max_n = max_n

    def run(self, input_path: Path, output_path: Path, use_tqdm: bool = True) -> int:
        """Processes the lines not yet in `output_path`; returns how many results it wrote."""
        num_done = _resume_point(output_path)
        lines = _numbered_lines(input_path)
        for _ in range(num_done):
            next(lines, None)
        state = _RunState(next_index=num_done)
        bar = tqdm(total=_count_lines(input_path), initial=num_done, desc="Batch lines", unit="line", disable=not use_tqdm)
        with output_path.open("a", encoding="utf-8") as out, bar:
            try:
                while True:
                    is_exhausted = self._admit(lines, state)
                    while state.next_index in state.results:
                        out.write(json.dumps(state.results.pop(state.next_index), ensure_ascii=False) + "\n")
                        out.flush()
                        state.next_index += 1
                        state.num_written += 1
                        bar.update(1)
                    if is_exhausted and not state.jobs:
                        return state.num_written
                    self._step(state)
            except BaseException:
                self.engine.abort_request(list(state.by_request))
                raise

    def _admit(self, lines: Iterator[tuple[int, str]], state: _RunState) -> bool:
        """Starts lines until `max_in_flight` run (a bad line's error is its result); True once none are left."""
        while len(state.jobs) < self.max_in_flight:
            item = next(lines, None)
            if item is None:
                return True
            index, text = item
            custom_id = None
            try:
                custom_id, url, raw = _parse_line(text)
                job = self._start(index, custom_id, url, raw)
            except APIError as error:
                state.results[index] = _error_result(index, custom_id, error)
                continue
            state.jobs[index] = job
            state.by_request.update((request_id, job) for request_id in job.request_ids)
        return False

    def _step(self, state: _RunState) -> None:
        """One engine step: its outputs go to their jobs, and a finished job's result is kept."""
        for delta in self.engine.step():
            job = state.by_request[delta.request_id]
            output = accumulate(job.outputs, delta)
            if output.finished:
                del state.by_request[delta.request_id]
                job.num_finished += 1
            if job.is_done:
                del state.jobs[job.index]
                state.results[job.index] = self._result(job)

    def _start(self, index: int, custom_id: str | None, url: str, raw: Any) -> BatchJob:
        """Validates and submits one line (a 400-style error if it is bad)."""
        body: ChatCompletionRequest | CompletionRequest
        processor = self.engine.input_processor
        if url == CHAT_URL:
            body = validate_body(raw, ChatCompletionRequest)
            body.check_supported()
            try:
                text_prompt = processor.render_chat(
                    [m.to_template_dict() for m in body.messages],
                    add_generation_prompt=body.add_generation_prompt,
                    continue_final_message=body.continue_final_message,
                    **(body.chat_template_kwargs or {}),
                )
            except Exception as exc:
                raise APIError(f"The messages could not be rendered: {exc}", param="messages") from exc
            prompts: list[str | list[int]] = [text_prompt]
            prompt_ids = [self.engine.tokenizer.encode(text_prompt)]
            max_tokens = body.requested_max_tokens
        else:
            body = validate_body(raw, CompletionRequest)
            body.check_supported()
            prompts = body.prompts
            prompt_ids = [processor.tokenize(p) if isinstance(p, str) else p for p in prompts]
            max_tokens = body.max_tokens
        if not prompt_ids or any(not ids for ids in prompt_ids):
            raise APIError("The prompt is empty.", param="prompt")
        params = build_sampling_params(
            body, processor, max(prompt_ids, key=len), max_tokens, self.generation_defaults, self.max_n
        )
        request_ids = [f"line{index}-p{p}-{uuid.uuid4().hex[:8]}" for p in range(len(prompts))]
        texts = [p if isinstance(p, str) else self.engine.tokenizer.decode(p) for p in prompts]
        for request_id, ids, prompt_text in zip(request_ids, prompt_ids, texts, strict=True):
            self._add(request_id, ids, params, body.priority, prompt_text, submitted=request_ids)
        return BatchJob(index, custom_id, body, request_ids, texts, sum(len(ids) for ids in prompt_ids))

    def _add(
        self, request_id: str, ids: list[int], params: SamplingParams, priority: int, text: str,
        submitted: list[str],
    ) -> None:
        try:
            self.engine.add_request(request_id, ids, params, priority, text)
        except PromptTooLongError as exc:
            self._abort_submitted(submitted, request_id)
            raise APIError(str(exc), param="max_tokens") from exc
        except ValueError as exc:
            self._abort_submitted(submitted, request_id)
            raise APIError(str(exc), param="prompt") from exc

    def _abort_submitted(self, submitted: list[str], failed: str) -> None:
        self.engine.abort_request(submitted[: submitted.index(failed)])

    def _result(self, job: BatchJob) -> dict[str, Any]:
        choices: list[CompletionOutput] = []
        for prompt_index, request_id in enumerate(job.request_ids):
            for sample in job.outputs[request_id].outputs:
                sample.index = prompt_index * job.body.n + sample.index
                choices.append(sample)
        num_completion_tokens = sum(len(c.token_ids) for c in choices)
        if isinstance(job.body, ChatCompletionRequest):
            body = self._chat_body(choices)
        else:
            body = self._completion_body(job, choices)
        body["usage"] = usage(job.num_prompt_tokens, num_completion_tokens)
        return {
            "id": f"batch_req_{uuid.uuid4().hex}",
            "custom_id": job.custom_id,
            "line": job.index,
            "response": {"status_code": 200, "body": body},
            "error": None,
        }

    def _chat_body(self, choices: list[CompletionOutput]) -> dict[str, Any]:
        tokenizer = self.engine.tokenizer
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": now(),
            "model": self.model_name,
            "choices": [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": chat_logprobs(tokenizer, c.logprobs),
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                }
                for c in choices
            ],
        }

    def _completion_body(self, job: BatchJob, choices: list[CompletionOutput]) -> dict[str, Any]:
        body = job.body
        assert isinstance(body, CompletionRequest)
        tokenizer = self.engine.tokenizer
        entries = []
        for c in choices:
            echo = job.prompts[c.index // body.n] if body.echo else ""
            logprobs = None
            if body.logprobs is not None and c.logprobs is not None:
                logprobs = completion_logprobs(tokenizer, c.logprobs, len(echo))
            entries.append({
                "index": c.index, "text": echo + c.text, "logprobs": logprobs,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
            })
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": now(),
            "model": self.model_name,
            "choices": entries,
        }


def _parse_line(text: str) -> tuple[str | None, str, Any]:
    """(custom_id, url, body) of a plain request body or an OpenAI batch line."""
    if not text.strip():
        raise APIError("The line is empty.")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise APIError(f"The line is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise APIError("The line must be a JSON object.")
    custom_id = None
    if isinstance(raw.get("body"), dict):
        custom_id = raw.get("custom_id")
        url = raw.get("url", CHAT_URL if "messages" in raw["body"] else COMPLETIONS_URL)
        raw = raw["body"]
        if url not in (CHAT_URL, COMPLETIONS_URL):
            raise APIError(f"Unsupported url {url!r}: use {CHAT_URL} or {COMPLETIONS_URL}.", param="url")
        return None if custom_id is None else str(custom_id), url, raw
    return None, CHAT_URL if "messages" in raw else COMPLETIONS_URL, raw


def _error_result(index: int, custom_id: str | None, error: APIError) -> dict[str, Any]:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "line": index,
        "response": {"status_code": error.status_code, "body": error.to_dict()},
        "error": error.to_dict()["error"],
    }


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            yield index, line.rstrip("\n")


def _count_lines(path: Path) -> int:
    with path.open("rb") as data:
        return sum(1 for _ in data)


def _resume_point(output_path: Path) -> int:
    """How many results the output already holds; a torn last line (a killed run) is cut off."""
    if not output_path.exists():
        return 0
    data = output_path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with output_path.open("r+b") as out:
            out.truncate(end)
            os.fsync(out.fileno())
    return data.count(b"\n", 0, end)
