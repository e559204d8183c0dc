"""A request's output constraint, checked before it reaches the engine: a schema, regex or grammar
that the engine's grammar library (xgrammar, or llguidance) does not parse is refused here (the
engine compiles it for the model's vocabulary)."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from proto.engine_input import StructuredOutput


class StructuredOutputError(ValueError):
    """A constraint that is malformed, or that the grammar library cannot parse; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


# vLLM's StructuredOutputsParams: the constraint kinds, one of which a request may set.
_KINDS = ("json", "regex", "choice", "grammar", "json_object")
# Its options that only tune the constraint; a value that asks for more than zeroserve does is refused.
_OPTIONS = {"disable_fallback": None, "disable_any_whitespace": None, "disable_additional_properties": False,
            "whitespace_pattern": None, "structural_tag": None}


def from_response_format(response_format: dict[str, Any] | None, backend: str = "xgrammar") -> StructuredOutput | None:
    """OpenAI's `response_format`: text (no constraint), json_object, or json_schema."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return checked(StructuredOutput("json_object"), "response_format", backend)
    if kind == "json_schema":
        json_schema = response_format.get("json_schema")
        schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
        if not isinstance(schema, dict):
            raise StructuredOutputError("'response_format' json_schema needs 'json_schema': {'name', 'schema'}.",
                                        "response_format")
        return checked(StructuredOutput("json", json.dumps(schema)), "response_format", backend)
    raise StructuredOutputError(
        f"'response_format' type must be 'text', 'json_object' or 'json_schema', got {kind!r}.", "response_format"
    )


def from_structured_outputs(params: dict[str, Any] | None, backend: str = "xgrammar") -> StructuredOutput | None:
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar, json_object."""
    if params is None:
        return None
    unknown = sorted(set(params) - set(_KINDS) - set(_OPTIONS))
    if unknown:
        raise StructuredOutputError(f"'structured_outputs' has unknown fields {unknown}.", "structured_outputs")
    for option, accepted in _OPTIONS.items():
        if params.get(option) not in (None, accepted, False):
            raise StructuredOutputError(f"'structured_outputs.{option}' is not supported by this server.",
                                        f"structured_outputs.{option}")
    given = [kind for kind in _KINDS if params.get(kind) not in (None, False)]
    if len(given) != 1:
        raise StructuredOutputError(
            f"'structured_outputs' needs exactly one of {list(_KINDS)}, got {given or 'none'}.", "structured_outputs"
        )
    return checked(_spec_of(given[0], params[given[0]]), f"structured_outputs.{given[0]}", backend)


def _spec_of(kind: str, value: Any) -> StructuredOutput:
    param = f"structured_outputs.{kind}"
    if kind == "json":
        return StructuredOutput("json", value if isinstance(value, str) else json.dumps(value))
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise StructuredOutputError("'structured_outputs.choice' must be a non-empty list of strings.", param)
        return StructuredOutput("choice", json.dumps(value))
    if not isinstance(value, str) or not value:
        raise StructuredOutputError(f"'{param}' must be a non-empty string.", param)
    return StructuredOutput(kind, value)


# The module each grammar backend's checks import.
_LIBRARIES = {"xgrammar": "xgrammar", "guidance": "llguidance"}


def library_of(backend: str) -> str | None:
    """The module a grammar backend's checks import (its import is slow: import it off the event loop)."""
    return _LIBRARIES.get(backend)


def checked(spec: StructuredOutput, param: str, backend: str = "xgrammar") -> StructuredOutput:
    """`spec`, once the backend's library parses it (a schema, regex or grammar that does not is a
    StructuredOutputError naming `param` and what is wrong)."""
    if backend == "guidance":
        return _checked_by_guidance(spec, param)
    import xgrammar

    try:
        if spec.kind == "json":
            xgrammar.Grammar.from_json_schema(spec.spec, any_whitespace=False)
        elif spec.kind == "regex":
            xgrammar.Grammar.from_regex(spec.spec)
        elif spec.kind == "grammar":
            xgrammar.Grammar.from_ebnf(spec.spec)
    except (RuntimeError, ValueError, TypeError) as exc:
        # NOTE: xgrammar's messages start "[time] source.cc:line: "; the rest says what is wrong.
        lines = [line for line in str(exc).splitlines() if line.strip()]
        reason = re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", lines[0]) if lines else type(exc).__name__
        raise StructuredOutputError(f"'{param}' does not compile: {reason}", param) from exc
    return spec


# llguidance's names of the constraint kinds (a json_object is any JSON object: always valid).
_GUIDANCE_FORMATS: dict[str, Literal["json_schema", "regex", "choice", "grammar"]] = {
    "json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar",
}


def _checked_by_guidance(spec: StructuredOutput, param: str) -> StructuredOutput:
    """`spec`, once llguidance parses it (its grammars are Lark or GBNF; its regexes Rust's)."""
    import llguidance

    if spec.kind not in _GUIDANCE_FORMATS:
        return spec
    try:
        error = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from(_GUIDANCE_FORMATS[spec.kind], spec.spec))
    except ValueError as exc:
        error = str(exc)
    if error:
        # NOTE: llguidance says where on its first line and what on an "error: ..." line, when it has one.
        lines = [line.strip() for line in error.splitlines() if line.strip()]
        reason = " ".join([lines[0], *(line for line in lines[1:] if line.startswith("error:"))][:2])
        raise StructuredOutputError(f"'{param}' does not compile: {reason}", param)
    return spec
