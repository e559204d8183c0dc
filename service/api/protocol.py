"""OpenAI request bodies, validated with pydantic; unknown fields are ignored, as OpenAI does."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from proto.engine_input import SamplingParams
from service.api.errors import APIError


class OpenAIModel(BaseModel):
    """Base of every request body."""

    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIModel):
    include_usage: bool = False


class TextPart(OpenAIModel):
    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    def to_template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        return {"role": "system" if self.role == "developer" else self.role, "content": content or ""}


class SamplingRequest(OpenAIModel):
    """Fields common to both endpoints."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    seed: int | None = None
    n: int = Field(default=1, ge=1)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    priority: int = 0

    def unsupported_params(self) -> list[str]:
        """Parameters given with a value this server cannot honour yet."""
        names = []
        if self.n != 1:
            names.append("n")
        if self.stop:
            names.append("stop")
        if self.presence_penalty:
            names.append("presence_penalty")
        if self.frequency_penalty:
            names.append("frequency_penalty")
        if self.logit_bias:
            names.append("logit_bias")
        return names

    def check_supported(self) -> None:
        names = self.unsupported_params()
        if names:
            raise APIError(f"'{names[0]}' is not supported by this server yet.", param=names[0])

    def to_sampling_params(self, max_tokens: int, defaults: dict[str, float]) -> SamplingParams:
        """The request's values, else the model's generation defaults, else OpenAI's."""
        temperature = self.temperature if self.temperature is not None else defaults.get("temperature", 1.0)
        top_p = self.top_p if self.top_p is not None else defaults.get("top_p", 1.0)
        top_k = self.top_k if self.top_k is not None else int(defaults.get("top_k", -1))
        return SamplingParams(
            temperature=temperature,
            top_p=top_p,
            top_k=None if top_k in (-1, 0) else top_k,
            seed=self.seed,
            max_tokens=max_tokens,
            ignore_eos=self.ignore_eos,
            stop_token_ids=list(self.stop_token_ids or []),
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    def unsupported_params(self) -> list[str]:
        names = super().unsupported_params()
        if self.logprobs:
            names.append("logprobs")
        if self.tools:
            names.append("tools")
        if self.response_format and self.response_format.get("type") != "text":
            names.append("response_format")
        return names

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def unsupported_params(self) -> list[str]:
        names = super().unsupported_params()
        for name in ("echo", "logprobs", "suffix", "best_of"):
            if getattr(self, name) not in (None, False) and not (name == "best_of" and self.best_of == 1):
                names.append(name)
        return names
