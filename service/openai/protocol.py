"""OpenAI request bodies (with vLLM's extensions), validated with pydantic. Every vLLM field has
its row in conformance.py: a refused one gets a 400 naming it; fields neither OpenAI nor vLLM
knows are ignored, and named in one log line, as vLLM does."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from proto.engine_input import StructuredOutput
from service.frontend.sampling_params import SamplingParams, generation_defaults_of
from service.frontend.structured_output import (
    StructuredOutputError,
    checked,
    from_response_format,
    from_structured_outputs,
)
from service.openai.conformance import refused_fields, unknown_fields
from service.openai.errors import APIError, validate_body
from service.openai.tool_calls import forced_schema, function_of

logger = logging.getLogger(__name__)


def _check_request_id(value: str) -> str:
    if not all("!" <= char <= "~" for char in value):
        raise ValueError("must be printable ASCII without spaces: it comes back in the X-Request-Id header and "
                         "names the stream in GET /v1/streams/{request_id}")
    return value


# A request id a body names (vLLM's extension), echoed in the X-Request-Id header.
RequestId = Annotated[
    str, Field(min_length=1, max_length=256, json_schema_extra={"pattern": "^[!-~]+$"}), AfterValidator(_check_request_id)
]


class OpenAIModel(BaseModel):
    """Base of every request body."""

    model_config = ConfigDict(extra="allow")

    @property
    def given_fields(self) -> dict[str, Any]:
        """The fields the body sets, declared here or not."""
        return {name: getattr(self, name) for name in self.model_fields_set} | (self.model_extra or {})

    def check_refused(self, conformance_model: str) -> None:
        """A 400 naming the first field conformance.py refuses that the body sets to another value than vLLM's default."""
        for name, row in refused_fields(conformance_model, self.given_fields):
            raise APIError(f"'{name}' is not supported by this server: {row.note}.", param=name)


class StreamOptions(OpenAIModel):
    """What a stream carries besides the choices."""

    include_usage: bool = False
    continuous_usage_stats: bool = False


class TextPart(OpenAIModel):
    """A text part of a message's content."""

    type: Literal["text"]
    text: str


class ChatMessage(OpenAIModel):
    """One chat message; extra fields (tool_call_id, tool_calls, name) reach the template, and so
    does a role of the template's own (as vLLM lets it)."""

    role: str
    content: str | list[TextPart] | None = None

    def to_template_dict(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        return {**(self.model_extra or {}), "role": role, "content": content or ""}


class SamplingRequest(OpenAIModel):
    """Fields common to both endpoints."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # NOTE: the values each sampling field takes are declared once, in proto/engine_input.py's
    # SAMPLING_RANGES (and the gateway's in service/frontend/sampling_params.py): a value outside
    # them gets a 400 naming the field from there (service/openai/prepare.py).
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    n: int = 1
    best_of: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    prompt_logprobs: int | None = None
    priority: int = 0
    data_parallel_rank: int | None = Field(default=None, ge=0)
    skip_special_tokens: bool | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    truncation_side: Literal["left", "right"] | None = None
    request_id: RequestId | None = None
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None

    # The conformance table's name of this body's model (vllm_fields.json).
    CONFORMANCE_MODEL: ClassVar[str] = ""

    @field_validator("logit_bias")
    @classmethod
    def _check_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        for key in value or {}:
            if not key.isdigit():
                raise ValueError(f"keys must be token ids, got {key!r}")
        return value

    def check_supported(self) -> None:
        """Raises a 400 naming the first parameter given with a value this server cannot honour; logs
        those neither this server nor vLLM knows (a misspelt one), which change nothing."""
        self.check_refused(self.CONFORMANCE_MODEL)
        if ignored := unknown_fields(self.CONFORMANCE_MODEL, self.model_extra or {}):
            logger.warning("The following fields were present in the request but ignored: %s", ignored)
        if self.stream_options is not None and not self.stream:
            raise APIError("The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                           param="stream_options")
        if self.best_of is not None and self.best_of > 1:
            raise APIError("'best_of' is not supported by this server; use 'n'.", param="best_of")

    @property
    def stop_strings(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    @property
    def num_logprobs(self) -> int | None:
        return None

    @property
    def num_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    # The body's names of SamplingParams' fields it calls otherwise (and, for a body converted from another
    # API's, of the chat fields that came from that API's: a path's head), and the name of its prompt.
    PARAM_NAMES: ClassVar[dict[str, str]] = {"num_prompt_logprobs": "prompt_logprobs"}
    # NOTE: the heads renamed whole: the rest of their path names nothing of the converted body.
    WHOLE_PARAM_NAMES: ClassVar[frozenset[str]] = frozenset()
    PROMPT_PARAM: ClassVar[str] = "prompt"

    def param_name(self, name: str) -> str:
        """The body's name of a SamplingParams field, or of a field path."""
        return self.renamed_param(name)

    @classmethod
    def renamed_param(cls, name: str) -> str:
        head, dot, rest = name.partition(".")
        if head not in cls.PARAM_NAMES:
            return name
        renamed = cls.PARAM_NAMES[head]
        return renamed if head in cls.WHOLE_PARAM_NAMES or not dot else f"{renamed}.{rest}"

    @classmethod
    def named_error(cls, error: APIError) -> APIError:
        """`error` naming the body's own field: the one place a converted body's errors are renamed."""
        if error.param is None or error.param.partition(".")[0] not in cls.PARAM_NAMES:
            return error
        head = error.param.partition(".")[0]
        renamed = cls.renamed_param(error.param)
        error.message = error.message.replace(f"'{error.param}'", f"'{renamed}'").replace(
            f"'{head}'", f"'{cls.PARAM_NAMES[head]}'")
        error.param = renamed
        return error

    @classmethod
    def validated(cls, fields: dict[str, Any]) -> Self:
        """`fields` (a body converted from another API's) as this body; errors name the fields they came from."""
        try:
            return validate_body(fields, cls)
        except APIError as error:
            raise cls.named_error(error) from error.__cause__

    def to_sampling_params(
        self, max_tokens: int, generation_config: dict[str, float], grammar_backend: str = "xgrammar"
    ) -> SamplingParams:
        """The request's values, else the model's generation defaults, else OpenAI's; raises
        SamplingParamsError for a value out of range (and checks the output constraint with
        `grammar_backend`'s parser)."""
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p}
        sampling = generation_defaults_of(generation_config) | {k: v for k, v in given.items() if v is not None}
        if sampling["top_k"] in (-1, 0):
            sampling["top_k"] = None
        return SamplingParams(
            **sampling,
            n=self.n,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=[(int(k), v) for k, v in (self.logit_bias or {}).items()],
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=min(self.min_tokens, max_tokens),
            ignore_eos=self.ignore_eos,
            stop_token_ids=list(self.stop_token_ids or []),
            stop=self.stop_strings,
            include_stop_str_in_output=self.include_stop_str_in_output,
            num_logprobs=self.num_logprobs,
            num_prompt_logprobs=self.num_prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens is not False,
            structured_output=self.structured_output(grammar_backend),
        )

    def structured_output(self, grammar_backend: str = "xgrammar") -> StructuredOutput | None:
        """The output constraint of `response_format` or `structured_outputs` (a 400 naming the
        field for one that does not compile, or for both at once)."""
        try:
            from_format = from_response_format(self.response_format, grammar_backend)
            from_params = from_structured_outputs(self.structured_outputs, grammar_backend)
        except StructuredOutputError as exc:
            raise APIError(str(exc), param=exc.param) from exc
        if from_format is not None and from_params is not None:
            raise APIError("Give 'response_format' or 'structured_outputs', not both.", param="structured_outputs")
        return from_format or from_params

    @property
    def names_a_constraint(self) -> bool:
        """Whether the body has a field that may constrain the answer (its check needs the grammar library)."""
        return self.response_format is not None or self.structured_outputs is not None

    @property
    def constraint_param(self) -> str:
        """The field the request's output constraint came from (for errors about it)."""
        return "structured_outputs" if self.structured_outputs is not None else "response_format"

    @property
    def requested_max_tokens(self) -> int | None:
        """The number of tokens asked for; None: what the context leaves."""
        return None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage_stats(self) -> bool:
        """Usage on every chunk: only with include_usage, as vLLM has it."""
        return self.include_usage and self.stream_options is not None and self.stream_options.continuous_usage_stats


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    include_reasoning: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False
    echo: bool = False
    documents: list[dict[str, str]] | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    return_prompt_text: bool | None = None

    CONFORMANCE_MODEL: ClassVar[str] = "chat"

    @property
    def response_role(self) -> str:
        """vLLM's role of the answer: the assistant's, or with no generation prompt the last message's."""
        return "assistant" if self.add_generation_prompt else self.messages[-1].role

    @property
    def echoed_text(self) -> str:
        """With `echo`, the last message's text when it is the answer's role (the answer goes on from it)."""
        last = self.messages[-1]
        if not self.echo or last.role != self.response_role:
            return ""
        return str(last.to_template_dict()["content"])

    def check_supported(self) -> None:
        super().check_supported()
        self._check_tools()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError("'top_logprobs' needs 'logprobs' set to true.", param="top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            raise APIError(
                "'continue_final_message' needs 'add_generation_prompt' set to false.",
                param="continue_final_message",
            )
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise APIError(
                "'continue_final_message' needs the last message to be the assistant's.",
                param="continue_final_message",
            )

    def _check_tools(self) -> None:
        for index, tool in enumerate(self.tools or []):
            function = tool.get("function") if isinstance(tool, dict) else None
            if tool.get("type", "function") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise APIError("Each tool must be {\"type\": \"function\", \"function\": {\"name\": ...}}.", param=f"tools.{index}")
        choice = self.tool_choice
        if choice is None or choice in ("auto", "none"):
            return
        if not self.tools:
            raise APIError("'tool_choice' needs 'tools'.", param="tool_choice")
        if choice == "required":
            return
        name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        if not isinstance(name, str) or function_of(self.tools, name) is None:
            raise APIError(f"'tool_choice' must be 'auto', 'none', 'required' or a function of 'tools', got {choice!r}.",
                           param="tool_choice")

    @property
    def names_a_constraint(self) -> bool:
        return super().names_a_constraint or bool(self.tools)

    @property
    def is_call_forced(self) -> bool:
        """Whether `tool_choice` forces a call of the tools offered ("required" or a named function)."""
        return bool(self.tools) and (isinstance(self.tool_choice, dict) or self.tool_choice == "required")

    def structured_output(self, grammar_backend: str = "xgrammar") -> StructuredOutput | None:
        """A forced tool call's schema (tool_choice "required" or a named function), else the answer's."""
        constraint = super().structured_output(grammar_backend)
        if not self.is_call_forced:
            return constraint
        if constraint is not None:
            raise APIError("A forced 'tool_choice' cannot be combined with 'response_format' or 'structured_outputs'.",
                           param="tool_choice")
        assert self.tools is not None and self.tool_choice is not None
        schema = forced_schema(self.tools, self.tool_choice, self.parallel_tool_calls)
        try:
            return checked(StructuredOutput("json", json.dumps(schema)), "tools", grammar_backend)
        except StructuredOutputError as exc:
            raise APIError(str(exc), param=exc.param) from exc

    @property
    def constraint_param(self) -> str:
        if self.is_call_forced:
            return "tool_choice"
        return super().constraint_param

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    PARAM_NAMES: ClassVar[dict[str, str]] = {"num_logprobs": "top_logprobs", "num_prompt_logprobs": "prompt_logprobs"}
    PROMPT_PARAM: ClassVar[str] = "messages"

    def param_name(self, name: str) -> str:
        if name == "max_tokens" and self.max_completion_tokens is not None:
            name = "max_completion_tokens"
        return super().param_name(name)


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    add_special_tokens: bool = True

    CONFORMANCE_MODEL: ClassVar[str] = "completions"


    PARAM_NAMES: ClassVar[dict[str, str]] = {"num_logprobs": "logprobs", "num_prompt_logprobs": "prompt_logprobs"}

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        return self.logprobs

    @property
    def num_prompt_logprobs(self) -> int | None:
        """Echoed prompts with logprobs report their prompt tokens' logprobs too."""
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, self.prompt_logprobs or 0)
        return self.prompt_logprobs

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: its text or its token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]
