"""The grammar libraries structured outputs run on: xgrammar (the default) and llguidance. Each
compiles a StructuredOutput against the model's vocabulary (cached by grammar) and makes one
matcher per request; both fill the same token bitmask (a bit per token, 32 to an int32)."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import torch

from proto.engine_input import StructuredOutput
from proto.gguf_header import read_gguf_metadata

# NOTE: compact JSON (no free whitespace between tokens): a small model given the freedom loops
# on newlines and spaces until max_tokens (vLLM's --disable-any-whitespace); ", " and ": " as
# json.dumps writes them.
_GUIDANCE_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_GUIDANCE_CACHE_SIZE = 256


class Matcher(Protocol):
    """One request's position in its grammar."""

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None: ...

    def accept(self, token_id: int) -> bool: ...

    def is_terminated(self) -> bool: ...

    def accept_prefix(self, token_ids: list[int]) -> int:
        """Accepts tokens while they match; returns how many it accepted."""
        ...

    def rollback(self, num_tokens: int) -> None: ...


class GrammarBackend(Protocol):
    """Compiles constraints for one model's vocabulary and makes matchers of them."""

    def compile(self, spec: StructuredOutput) -> Any: ...

    def matcher(self, compiled: Any) -> Matcher: ...


def make_backend(name: str, model_path: str, vocab_size: int, eos_token_ids: list[int]) -> GrammarBackend:
    """The backend `name` ("auto" is xgrammar) for the model's vocabulary (read now: slow, once)."""
    if name == "guidance":
        return GuidanceBackend(model_path, vocab_size, eos_token_ids)
    return XGrammarBackend(model_path, vocab_size, eos_token_ids)


class XGrammarBackend:
    """xgrammar: grammars compiled into token-mask automata (its compiler caches them by text)."""

    def __init__(self, model_path: str, vocab_size: int, eos_token_ids: list[int]) -> None:
        import xgrammar

        info = _xgrammar_tokenizer_info(model_path, vocab_size, eos_token_ids)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1)

    def compile(self, spec: StructuredOutput) -> Any:
        import xgrammar

        if spec.kind == "json":
            return self.compiler.compile_json_schema(spec.spec, any_whitespace=False)
        if spec.kind == "json_object":
            return self.compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
        if spec.kind == "regex":
            return self.compiler.compile_regex(spec.spec)
        if spec.kind == "choice":
            return self.compiler.compile_grammar(xgrammar.Grammar.from_ebnf(choice_ebnf(json.loads(spec.spec))))
        return self.compiler.compile_grammar(spec.spec)

    def matcher(self, compiled: Any) -> Matcher:
        return _XGrammarMatcher(compiled)


class _XGrammarMatcher:
    def __init__(self, compiled: Any) -> None:
        import xgrammar

        self._matcher = xgrammar.GrammarMatcher(compiled)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token_id: int) -> bool:
        return bool(self._matcher.accept_token(token_id))

    def is_terminated(self) -> bool:
        return bool(self._matcher.is_terminated())

    def accept_prefix(self, token_ids: list[int]) -> int:
        num_accepted = 0
        for token_id in token_ids:
            if self._matcher.is_terminated() or not self._matcher.accept_token(token_id):
                break
            num_accepted += 1
        return num_accepted

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)


class GuidanceBackend:
    """llguidance: grammars (JSON schemas, regexes, Lark or GBNF) parsed lazily against the
    vocabulary's token trie; a checked matcher per grammar is kept and copied for each request."""

    def __init__(self, model_path: str, vocab_size: int, eos_token_ids: list[int]) -> None:
        import llguidance

        self.tokenizer = llguidance.LLTokenizer(_tokenizer_json(model_path), n_vocab=vocab_size, eos_token=eos_token_ids)
        self._cache: OrderedDict[str, Any] = OrderedDict()

    def compile(self, spec: StructuredOutput) -> Any:
        import llguidance

        grammar = guidance_grammar(spec)
        if grammar in self._cache:
            self._cache.move_to_end(grammar)
            return self._cache[grammar]
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        self._cache[grammar] = matcher
        if len(self._cache) > _GUIDANCE_CACHE_SIZE:
            self._cache.popitem(last=False)
        return matcher

    def matcher(self, compiled: Any) -> Matcher:
        return _GuidanceMatcher(compiled.deep_copy())


class _GuidanceMatcher:
    def __init__(self, matcher: Any) -> None:
        self._matcher = matcher

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        # NOTE: what llguidance.torch.fill_next_token_bitmask does, without importing that module
        # (its import compiles a mask kernel with torch.compile, pulling in Inductor).
        words = bitmask[row]
        assert bitmask.dtype == torch.int32 and bitmask.device.type == "cpu" and words.is_contiguous()
        self._matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())

    def accept(self, token_id: int) -> bool:
        return bool(self._matcher.consume_token(token_id))

    def is_terminated(self) -> bool:
        # NOTE: stopped: the grammar is complete and only the end of the sequence may follow.
        return bool(self._matcher.is_stopped())

    def accept_prefix(self, token_ids: list[int]) -> int:
        # NOTE: never consume_token here: a token that does not match leaves it in error for good.
        return int(self._matcher.try_consume_tokens(token_ids))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self._matcher.rollback(num_tokens)


def guidance_grammar(spec: StructuredOutput) -> str:
    """The llguidance grammar of a constraint (not yet checked)."""
    import llguidance

    if spec.kind == "json":
        return str(llguidance.LLMatcher.grammar_from_json_schema(spec.spec, overrides=_GUIDANCE_JSON))
    if spec.kind == "json_object":
        return str(llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', overrides=_GUIDANCE_JSON))
    if spec.kind == "regex":
        return str(llguidance.LLMatcher.grammar_from_regex(spec.spec))
    return str(llguidance.grammar_from("choice" if spec.kind == "choice" else "grammar", spec.spec))


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar matching exactly one of `choices`."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)


def _xgrammar_tokenizer_info(model_path: str, vocab_size: int, stop_token_ids: list[int]) -> Any:
    """xgrammar's view of the model's vocabulary: a GGUF's tokens as stored (byte-level for its
    "gpt2" tokenizers, SentencePiece byte fallback for "llama" ones), read in well under a second
    (transformers takes ~13 s to convert the default model's); a Hugging Face folder's through
    transformers' fast tokenizer."""
    import xgrammar

    path = Path(model_path)
    if path.suffix == ".gguf":
        metadata = read_gguf_metadata(path)
        is_byte_level = metadata.get("tokenizer.ggml.model") == "gpt2"
        return xgrammar.TokenizerInfo(
            metadata["tokenizer.ggml.tokens"],
            xgrammar.VocabType.BYTE_LEVEL if is_byte_level else xgrammar.VocabType.BYTE_FALLBACK,
            vocab_size=vocab_size, stop_token_ids=stop_token_ids, add_prefix_space=not is_byte_level,
        )
    import transformers

    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    return xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)


def _tokenizer_json(model_path: str) -> str:
    """The model's tokenizer as Hugging Face tokenizers' JSON: a folder's tokenizer.json, or the
    one a GGUF's vocabulary makes (as the gateway builds it)."""
    path = Path(model_path)
    if path.suffix != ".gguf":
        return (path / "tokenizer.json").read_text(encoding="utf-8")
    from proto.gguf_tokenizer import build_gguf_backend

    return str(build_gguf_backend(read_gguf_metadata(path)).to_str())
