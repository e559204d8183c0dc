"""What every route needs: the engine client and the names the model is served under."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, NamedTuple

from proto.engine_input import SamplingParams
from service.api.errors import APIError
from service.api.protocol import SamplingRequest
from service.async_llm import AsyncLLM
from service.input_processor import PromptTooLongError
from service.outputs import RequestOutput


class ServerState:
    """Shared by the routes of one gateway process."""

    def __init__(
        self,
        llm: AsyncLLM,
        served_model_names: list[str],
        generation_defaults: dict[str, float] | None = None,
    ) -> None:
        self.llm = llm
        self.served_model_names = served_model_names
        self.generation_defaults = generation_defaults or {}

    def model_name(self, body: SamplingRequest) -> str:
        """The served name the request asks for (the first one when it names none)."""
        if body.model is None or body.model == "":
            return self.served_model_names[0]
        if body.model not in self.served_model_names:
            raise APIError(
                f"The model '{body.model}' does not exist. Served: {', '.join(self.served_model_names)}.",
                status_code=404,
                param="model",
                code="model_not_found",
            )
        return body.model

    def sampling_params(self, body: SamplingRequest, prompt_token_ids: list[int], max_tokens: int | None) -> SamplingParams:
        body.check_supported()
        if max_tokens is None:
            max_tokens = self.llm.input_processor.default_max_tokens(prompt_token_ids)
        try:
            return body.to_sampling_params(max_tokens, self.generation_defaults)
        except ValueError as exc:
            raise APIError(str(exc)) from exc

    def generate(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, priority: int
    ) -> AsyncIterator[RequestOutput]:
        """Validates the request now (a 400 before any streaming), then streams its outputs."""
        try:
            request = self.llm.input_processor.process(request_id, prompt_token_ids, params, priority)
        except PromptTooLongError as exc:
            raise APIError(str(exc), param="max_tokens") from exc
        except ValueError as exc:
            raise APIError(str(exc), param="prompt") from exc
        return self.llm.generate(request)


class Collected(NamedTuple):
    """A whole, non-streamed generation."""

    text: str
    num_tokens: int
    finish_reason: str | None


async def collect(outputs: AsyncIterator[RequestOutput]) -> Collected:
    """Drains a request's deltas into its whole output."""
    texts, num_tokens, finish_reason = [], 0, None
    async for output in outputs:
        completion = output.outputs[0]
        texts.append(completion.text)
        num_tokens += len(completion.token_ids)
        finish_reason = completion.finish_reason
    return Collected("".join(texts), num_tokens, finish_reason)


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_completion_tokens,
        "total_tokens": num_prompt_tokens + num_completion_tokens,
    }
