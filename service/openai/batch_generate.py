"""`zeroserve generate`: a JSONL file of OpenAI request bodies → a JSONL file of results.

Each input line is a completions or chat request body (or an OpenAI batch line,
`{"custom_id", "url", "body"}`); each output line is that line's result, in input order:
`{"id", "custom_id", "line", "response": {"status_code", "request_id", "body"}, "error"}` as OpenAI's
batch output reads. Results are flushed line by line, so a rerun skips the lines already written.
What a line goes through (read, checked, prepared, its result shaped) is shared with the server's
Batch API (service/openai/batch_worker.py); only the loop differs, this one stepping an LLMEngine.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from service.frontend.llm_engine import LLMEngine
from service.frontend.outputs import RequestOutput, accumulate
from service.model_files.tokenizer import Tokenizer
from service.openai.answer import resolve_parsers
from service.openai.errors import APIError, validate_body
from service.openai.prepare import Prepared, Preparer, new_request_id
from service.openai.protocol import ChatCompletionRequest, CompletionRequest
from service.openai.response_bodies import ChatResponse, CompletionResponse

DEFAULT_MAX_IN_FLIGHT = 256


Body = ChatCompletionRequest | CompletionRequest


@dataclass(frozen=True)
class BatchEndpoints:
    """The paths a batch line may name, each with the body it carries: the route table's rows the Batch API
    may call (service/api/routes.py's `batch_endpoints`)."""

    bodies: Mapping[str, type[Body]]

    def url_of(self, line: BatchLine) -> str:
        """The path a line names; a plain body names none: a chat's when it has messages, else a completion's."""
        if line.url is not None:
            return line.url
        kind = ChatCompletionRequest if isinstance(line.raw, dict) and "messages" in line.raw else CompletionRequest
        return next(url for url, model in self.bodies.items() if issubclass(model, kind))

    def body_model(self, url: str) -> type[Body]:
        """The body `url` carries; a 400 naming `url` for a path no batch may call."""
        model = self.bodies.get(url)
        if model is None:
            raise APIError(f"Unsupported url {url!r}: use {' or '.join(self.bodies)}.", param="url")
        return model


class LineError(APIError):
    """A line that never became a request (not JSON, not an object, its batch expired first): its
    result carries OpenAI's `error`, with no `response`."""

    def __init__(self, message: str, code: str = "invalid_line") -> None:
        super().__init__(message, code=code)


@dataclass(frozen=True)
class BatchLine:
    """One input line read: its place, its custom_id, the method and endpoint it names (None: a plain
    body, which names none) and its request body, unchecked."""

    index: int
    custom_id: str | None
    method: str
    url: str | None
    raw: Any

    def request_body(self, endpoints: BatchEndpoints, endpoint: str | None = None) -> Body:
        """The body checked against its method and endpoint (a 400 naming the problem); a batch's lines
        must name the batch's `endpoint`."""
        if self.method != "POST":
            raise APIError(f"The line's method {self.method!r} is not 'POST'.", param="method")
        url = endpoints.url_of(self)
        model = endpoints.body_model(url)
        if endpoint is not None and url != endpoint:
            raise APIError(f"The line's url {url!r} is not the batch's endpoint {endpoint!r}.", param="url")
        return validate_body(self.raw, model)

    def ids(self, body: Body) -> tuple[str, str]:
        """The answer's id and its engine requests' (unique to this run)."""
        prefix = "chatcmpl" if isinstance(body, ChatCompletionRequest) else "cmpl"
        return new_request_id(prefix), f"line{self.index}-{uuid.uuid4().hex[:8]}"


@dataclass
class BatchJob:
    """One input line in flight: its prompts' requests and their outputs so far."""

    line: BatchLine
    body: Body
    prepared: Prepared
    outputs: dict[str, RequestOutput] = field(default_factory=dict)
    num_finished: int = 0

    @property
    def is_done(self) -> bool:
        return self.num_finished == len(self.prepared.parent_ids)


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
        endpoints: BatchEndpoints,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_n: int = 16,
    ) -> None:
        self.engine = engine
        self.endpoints = endpoints
        # NOTE: the parsers' defaults ("auto"): a harmony model's answers are read as harmony, others' left as text.
        self.parsers = resolve_parsers("auto", "auto", engine.tokenizer.chat_template)
        self.preparer = Preparer(
            engine.input_processor, [model_name], generation_defaults, max_n, self.parsers[1], is_any_model_served=True
        )
        self.max_in_flight = max_in_flight

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
                line = read_line(index, text)
                custom_id = line.custom_id
                job = self._start(line)
            except APIError as error:
                state.results[index] = error_result(index, custom_id, error)
                continue
            state.jobs[index] = job
            state.by_request.update((request_id, job) for request_id in job.prepared.parent_ids)
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
                index = job.line.index
                del state.jobs[index]
                outputs = [job.outputs[parent_id] for parent_id in job.prepared.parent_ids]
                state.results[index] = answer_result(
                    job.line, job.body, job.prepared, outputs, self.engine.tokenizer, *self.parsers
                )

    def _start(self, line: BatchLine) -> BatchJob:
        """Checks and submits one line (a 400-style error if it is bad): every sample of every
        prompt is checked before any is sent."""
        body = line.request_body(self.endpoints)
        prepared = self.preparer.prepare_now(body, line.ids(body))
        for parent_id, prompt, samples in zip(
            prepared.parent_ids, prepared.prompts, prepared.requests_by_prompt, strict=True
        ):
            self.engine.add_processed(parent_id, samples, prepared.params, prompt.text)
        return BatchJob(line, body, prepared)


def answer_result(
    line: BatchLine, body: Body, prepared: Prepared, outputs: list[RequestOutput], tokenizer: Tokenizer,
    tool_call_parser: str | None = None, reasoning_parser: str | None = None,
) -> dict[str, Any]:
    """A line's result line: its answer (one whole output per prompt) as the route would send it."""
    answer: dict[str, Any]
    if isinstance(body, ChatCompletionRequest):
        answer = ChatResponse(prepared, body, tokenizer, tool_call_parser, reasoning_parser).whole(outputs[0])
    else:
        answer = CompletionResponse(prepared, body, tokenizer).whole(outputs)
    return {
        "id": _batch_request_id(),
        "custom_id": line.custom_id,
        "line": line.index,
        "response": {"status_code": 200, "request_id": prepared.response_id, "body": answer},
        "error": None,
    }


def read_line(index: int, text: str) -> BatchLine:
    """A plain request body or an OpenAI batch line (`{"custom_id", "method", "url", "body"}`); a
    400-style error if it is neither."""
    return BatchLine(index, *_parse_line(text))


def _parse_line(text: str) -> tuple[str | None, str, str | None, Any]:
    """(custom_id, method, url, body) of a plain request body or an OpenAI batch line."""
    if not text.strip():
        raise LineError("The line is empty.")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise LineError(f"The line is not valid JSON: {exc}", code="invalid_json_line") from exc
    if not isinstance(raw, dict):
        raise LineError("The line must be a JSON object.")
    if isinstance(raw.get("body"), dict):
        custom_id, url = raw.get("custom_id"), raw.get("url")
        method = raw.get("method", "POST")
        return None if custom_id is None else str(custom_id), str(method), None if url is None else str(url), raw["body"]
    return None, "POST", None, raw


def _batch_request_id() -> str:
    return f"batch_req_{uuid.uuid4().hex}"


def error_result(index: int, custom_id: str | None, error: APIError) -> dict[str, Any]:
    """A line's result when it could not be answered, in OpenAI's shape: the error answer the route
    would have sent as its `response`, or, for a line that never became a request, its `error` alone."""
    result: dict[str, Any] = {"id": _batch_request_id(), "custom_id": custom_id, "line": index}
    if isinstance(error, LineError):
        return result | {"response": None, "error": {"code": error.code, "message": error.message}}
    response = {"status_code": error.status_code, "request_id": _batch_request_id(), "body": error.to_dict()}
    return result | {"response": response, "error": None}


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    with path.open(encoding="utf-8") as lines:
        for index, line in enumerate(lines):
            yield index, line.rstrip("\n")


def _count_lines(path: Path) -> int:
    with path.open("rb") as data:
        return sum(1 for _ in data)


def num_lines_left(input_path: Path, output_path: Path) -> int:
    """How many lines of the input a run would still answer (those past the results already written)."""
    return max(0, _count_lines(input_path) - _resume_point(output_path))


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
