"""POST /v1/messages and /v1/messages/count_tokens bodies, as Anthropic documents them, validated
with pydantic: every problem a 400 naming the field (its path in the body). `check_supported`
refuses, as Anthropic does, a top-level field Anthropic does not document ("NAME: Extra inputs are
not permitted"), and names those it documents that this server cannot honour; the documented ones
that change nothing here are logged as ignored."""

from __future__ import annotations

import logging
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.openai.errors import APIError

logger = logging.getLogger(__name__)

# Anthropic's fields that need what a local server has not (code execution, remote MCP servers,
# server-side context editing): a 400 names them.
REFUSED_FIELDS = {
    "container": "there is no code-execution container here",
    "mcp_servers": "this server connects to no MCP servers; declare the tools in 'tools'",
    "context_management": "this server edits no context; send the conversation as it should be read",
    "compaction": "this server compacts no context; send the conversation as it should be read",
}
# Anthropic's fields that change nothing on a local server (where it runs, billing, priority, a
# cache breakpoint where the prefix cache is automatic): accepted, and logged as ignored.
IGNORED_FIELDS = frozenset({
    "cache_control", "service_tier", "speed", "inference_geo", "diagnostics", "billing_policy", "fallbacks",
    "fallback_credit_token", "thread",
})


class AnthropicModel(BaseModel):
    """Base of every body and block: fields it does not declare are kept, and ignored."""

    model_config = ConfigDict(extra="allow")


class TextBlock(AnthropicModel):
    """Text; `cache_control` is accepted and needs nothing (the prefix cache is automatic)."""

    type: Literal["text"]
    text: str


class ToolUseBlock(AnthropicModel):
    """A call the assistant made: its id, the tool's name and its input."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(AnthropicModel):
    """What a call returned (in a user turn), by the call's id."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: list[TextBlock] | str = ""
    is_error: bool = False

    @property
    def text(self) -> str:
        text = self.content if isinstance(self.content, str) else "\n\n".join(block.text for block in self.content)
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(AnthropicModel):
    """Earlier reasoning sent back; not shown to the model again, as chat templates drop it."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(AnthropicModel):
    """Earlier reasoning sent back encrypted; dropped like `ThinkingBlock`."""

    type: Literal["redacted_thinking"]
    data: str


ContentBlock = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]


class Message(AnthropicModel):
    """One turn of the conversation; a `system` one is an instruction where it stands (Claude Code
    sends those beside the top-level `system`)."""

    role: Literal["user", "assistant", "system"]
    content: list[ContentBlock] | str


class Tool(AnthropicModel):
    """A client tool: its name, what it is for, and the JSON schema of its input."""

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoiceAuto(AnthropicModel):
    """The model calls a tool or not."""

    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(AnthropicModel):
    """The model calls one of the tools (generated under their schemas)."""

    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(AnthropicModel):
    """The model calls the named tool (its input generated under its schema)."""

    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(AnthropicModel):
    """The model calls no tool (the tools are left out of the prompt)."""

    type: Literal["none"]


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class Thinking(AnthropicModel):
    """Whether the model reasons first (the chat template's `enable_thinking`); `budget_tokens` is
    accepted but not enforced: the reasoning ends when the model ends it, or at `max_tokens`."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class OutputFormat(AnthropicModel):
    """An answer that is JSON matching `schema`."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(AnthropicModel):
    """How the answer is shaped: its format, and the reasoning effort."""

    format: OutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class CountTokensRequest(AnthropicModel):
    """POST /v1/messages/count_tokens: what a message's prompt is made of."""

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None

    # The fields Anthropic documents for this body that it does not declare.
    OTHER_FIELDS: ClassVar[frozenset[str]] = frozenset({"cache_control", "speed", "context_management", "mcp_servers"})

    def check_supported(self) -> None:
        """A 400 naming the first field given that Anthropic does not document, or that this server
        cannot honour; one log line naming those it ignores."""
        extra = self.model_extra or {}
        for name in extra:
            if name not in self.OTHER_FIELDS:
                raise APIError(f"{name}: Extra inputs are not permitted", param=name)
        for name, why in REFUSED_FIELDS.items():
            if extra.get(name) is not None:
                raise APIError(f"'{name}' is not supported by this server: {why}.", param=name)
        if isinstance(self.tool_choice, ToolChoiceTool) and self.tool_choice.name not in {
            tool.name for tool in self.tools or []
        }:
            raise APIError(f"'tool_choice.name' {self.tool_choice.name!r} is not one of 'tools'.",
                           param="tool_choice.name")
        if isinstance(self.tool_choice, ToolChoiceAny | ToolChoiceTool) and not self.tools:
            raise APIError("'tool_choice' needs 'tools'.", param="tool_choice")
        if ignored := sorted(name for name in extra if name in IGNORED_FIELDS):
            logger.warning("The following fields were present in the request but ignored: %s", ignored)


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    stream: bool = False

    OTHER_FIELDS: ClassVar[frozenset[str]] = frozenset(REFUSED_FIELDS) | IGNORED_FIELDS
