"""What every route needs: the engine client, the served names, and request fan-out."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from prometheus_client import CollectorRegistry

from service.api.admission import Admission
from service.frontend.async_llm import AsyncLLM
from service.frontend.input_processor import Prompt
from service.frontend.outputs import RequestOutput
from service.frontend.sampling_params import SamplingParams
from service.frontend.structured_output import load_library
from service.observability.dashboard import RecentRequests
from service.openai.errors import APIError
from service.openai.protocol import ChatCompletionRequest, SamplingRequest
from service.openai.reasoning import constraint_after_reasoning
from service.openai.request_fields import build_sampling_params, engine_requests

DEFAULT_MAX_N = 16
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 2**20


class ServerState:
    """Shared by the routes of one gateway process."""

    def __init__(
        self,
        llm: AsyncLLM,
        served_model_names: list[str],
        generation_defaults: dict[str, float] | None = None,
        max_n: int = DEFAULT_MAX_N,
        max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
        metrics_registry: CollectorRegistry | None = None,
        admission: Admission | None = None,
        tool_call_parser: str = "none",
        reasoning_parser: str = "none",
        recent_requests: RecentRequests | None = None,
    ) -> None:
        self.llm = llm
        self.served_model_names = served_model_names
        self.generation_defaults = generation_defaults or {}
        self.max_n = max_n
        self.max_request_body_bytes = max_request_body_bytes
        self.metrics_registry = metrics_registry
        self.admission = admission or Admission()
        self.tool_call_parser = None if tool_call_parser == "none" else tool_call_parser
        self.reasoning_parser = None if reasoning_parser == "none" else reasoning_parser
        # NOTE: the last finished requests, for the dashboard (None: it lists none).
        self.recent_requests = recent_requests

    @property
    def engine_status(self) -> str:
        """"ok" while an engine serves, else why none does: "dead", "recovering" (a lost engine
        restarts) or "waiting_for_engine" (every engine left cleanly; remote ones may join)."""
        if self.llm.is_dead:
            return "dead"
        if self.llm.engine_client.is_recovering:
            return "recovering"
        if not self.llm.engine_client.live_engine_indices:
            return "waiting_for_engine"
        return "ok"

    def model_name(self, model: str | None) -> str:
        """The served name the request asks for (the first one when it names none)."""
        if model is None or model == "":
            return self.served_model_names[0]
        if model not in self.served_model_names:
            raise APIError(
                f"The model '{model}' does not exist. Served: {', '.join(self.served_model_names)}.",
                status_code=404,
                param="model",
                code="model_not_found",
            )
        return model

    async def sampling_params(self, body: SamplingRequest, prompts: list[Prompt]) -> SamplingParams:
        """The body's SamplingParams; a chat answer's constraint holds after its reasoning, with a
        reasoning parser."""
        if body.names_a_constraint:
            await load_library(self.llm.input_processor.grammar_backend)
        params = build_sampling_params(body, self.llm.input_processor, prompts, self.generation_defaults, self.max_n)
        spec = params.structured_output
        if spec is not None and self.reasoning_parser is not None and isinstance(body, ChatCompletionRequest):
            (prompt,) = prompts
            params.structured_output = constraint_after_reasoning(
                spec, self.reasoning_parser, self.llm.tokenizer, prompt.token_ids
            )
        return params

    async def generate(
        self,
        request_id: str,
        prompts: Sequence[Prompt],
        params: SamplingParams,
        body: SamplingRequest,
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Checks every sample now (a 400 before any streaming), then streams their outputs as
        (choice index, delta); choice `i * n + j` is sample j of prompt i. A constrained request
        waits for its first output: a grammar the engine could not compile (in time) is a 400
        naming the constraint. A timeout or the end of a drain ends every unfinished choice with
        finish_reason "abort", then raises."""
        outputs = self._generate(request_id, prompts, params, body)
        if params.structured_output is None:
            return outputs
        return await _checked_first(outputs, body.constraint_param)

    def _generate(
        self,
        request_id: str,
        prompts: Sequence[Prompt],
        params: SamplingParams,
        body: SamplingRequest,
    ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        rank = body.data_parallel_rank
        if rank is not None and not self.llm.engine_client.is_serving_rank(rank):
            raise APIError(f"'data_parallel_rank' {rank} is not a serving engine.", param="data_parallel_rank")
        requests = []
        for prompt_index, prompt in enumerate(prompts):
            parent_id = request_id if len(prompts) == 1 else f"{request_id}-p{prompt_index}"
            requests += engine_requests(body, self.llm.input_processor, parent_id, prompt, params)
        return self.admission.guard(self.llm.generate(requests, params), len(requests))


async def _checked_first(
    outputs: AsyncGenerator[tuple[int, RequestOutput], None], param: str
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """`outputs`, once the first has come; a first output that is the engine's error (its grammar
    did not compile) is a 400 naming `param` instead."""
    try:
        first = await anext(outputs)
    except StopAsyncIteration:
        return outputs
    completion = first[1].outputs[0] if first[1].outputs else None
    if completion is not None and completion.finish_reason == "error" and not completion.token_ids:
        await outputs.aclose()
        raise APIError(f"'{param}' could not be used: {completion.stop_reason}.", param=param)
    return _chained(first, outputs)


async def _chained(
    first: tuple[int, RequestOutput], outputs: AsyncGenerator[tuple[int, RequestOutput], None]
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    try:
        yield first
        async for item in outputs:
            yield item
    finally:
        await outputs.aclose()
