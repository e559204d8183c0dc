"""The model's tokenizer and chat template, built from a GGUF file or a Hugging Face folder."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend
from tokenizers import processors

from proto.gguf_header import read_gguf_metadata
from proto.gguf_tokenizer import adds_bos_eos, build_gguf_backend

_TEMPLATE_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class Tokenizer:
    """Text <-> token ids, plus rendering chats into a prompt with the model's template."""

    def __init__(self, backend: Backend, chat_template: str | None, special_tokens: dict[str, str]) -> None:
        """`special_tokens` maps names like "bos_token"/"eos_token" to token text."""
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = special_tokens
        self._compiled_template: jinja2.Template | None = None

    @classmethod
    def from_model(cls, path: Path) -> Tokenizer:
        """The tokenizer of a `.gguf` file or a Hugging Face model folder."""
        if path.is_file() and path.suffix == ".gguf":
            return cls._from_gguf(path)
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return cls._from_hf_dir(path)
        raise ValueError(f"No tokenizer at {path}: expected a .gguf file or a folder with tokenizer.json.")

    @classmethod
    def _from_gguf(cls, path: Path) -> Tokenizer:
        metadata = read_gguf_metadata(path)
        tokens: list[str] = metadata["tokenizer.ggml.tokens"]
        special_tokens = {}
        for name, key in zip(_TEMPLATE_TOKEN_NAMES, ("bos", "eos", "unknown", "padding"), strict=False):
            token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
            if token_id is not None:
                special_tokens[name] = tokens[token_id]
        backend = build_gguf_backend(metadata)
        add_bos, add_eos = adds_bos_eos(metadata)
        backend.post_processor = _bos_eos_processor(backend, special_tokens, add_bos, add_eos)
        return cls(backend, metadata.get("tokenizer.chat_template"), special_tokens)

    @classmethod
    def _from_hf_dir(cls, path: Path) -> Tokenizer:
        backend = Backend.from_file(str(path / "tokenizer.json"))
        # NOTE: a tokenizer.json may pad and truncate every text (BERT folders' 128 tokens): the server
        # counts, limits and batches tokens itself.
        backend.no_padding()
        backend.no_truncation()
        config_path = path / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_path.is_file():
            config = json.loads(config_path.read_text(encoding="utf-8"))
        special_tokens = {
            name: value["content"] if isinstance(value, dict) else value
            for name in _TEMPLATE_TOKEN_NAMES
            if (value := config.get(name)) is not None
        }
        # NOTE: without explicit flags, tokenizer.json's own post-processor already knows.
        if "add_bos_token" in config or "add_eos_token" in config:
            add_bos, add_eos = bool(config.get("add_bos_token")), bool(config.get("add_eos_token"))
            backend.post_processor = _bos_eos_processor(backend, special_tokens, add_bos, add_eos)
        jinja_path = path / "chat_template.jinja"
        chat_template = _pick_template(config.get("chat_template"))
        if jinja_path.is_file():
            chat_template = jinja_path.read_text(encoding="utf-8")
        return cls(backend, chat_template, special_tokens)

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of every special token (the ones `decode(skip_special_tokens=True)` drops)."""
        return sorted(i for i, token in self.backend.get_added_tokens_decoder().items() if token.special)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; with `add_special_tokens`, BOS/EOS as the model's config asks."""
        ids: list[int] = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def encode_truncated(self, text: str, max_tokens: int) -> list[int]:
        """Token ids of `text` with the model's special tokens, its first tokens kept so that all of them
        come to at most `max_tokens` (as transformers truncates on the right; the special tokens stay)."""
        encoding = self.backend.encode(text, add_special_tokens=False)
        processor = self.backend.post_processor
        num_special = processor.num_special_tokens_to_add(False) if processor is not None else 0
        encoding.truncate(max(max_tokens - num_special, 0))
        return list(self.backend.post_process(encoding, add_special_tokens=True).ids)

    def encode_pair(self, first: str, second: str) -> tuple[list[int], list[int]]:
        """Token ids of a text pair as the model's template joins them (BERT's `[CLS] a [SEP] b [SEP]`), and
        each token's segment (0: the first text's, 1: the second's)."""
        encoding = self.backend.encode(first, second, add_special_tokens=True)
        return list(encoding.ids), list(encoding.type_ids)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        text: str = self.backend.decode(token_ids, skip_special_tokens=skip_special_tokens)
        return text

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **template_kwargs: Any
    ) -> str:
        """The prompt text for a chat, rendered as transformers renders it."""
        if self.chat_template is None:
            raise ValueError("This model has no chat template; send a plain completion prompt instead.")
        if self._compiled_template is None:
            self._compiled_template = _compile_template(self.chat_template)
        variables = {"tools": None, "documents": None, **self.special_tokens, **template_kwargs}
        return self._compiled_template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **variables
        )

    def _special_id(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self.backend.token_to_id(token)


def _pick_template(value: str | list[dict[str, str]] | None) -> str | None:
    """`tokenizer_config.json`'s template: a string, or named templates of which "default"."""
    if value is None or isinstance(value, str):
        return value
    templates = {entry["name"]: entry["template"] for entry in value}
    return templates.get("default", next(iter(templates.values()), None))


def _bos_eos_processor(
    backend: Backend, special_tokens: dict[str, str], add_bos: bool, add_eos: bool
) -> processors.TemplateProcessing:
    """A post-processor putting BOS/EOS around encoded text, as transformers builds it."""
    bos = special_tokens.get("bos_token") if add_bos else None
    eos = special_tokens.get("eos_token") if add_eos else None
    single = " ".join(part for part in (bos and f"{bos}:0", "$A:0", eos and f"{eos}:0") if part)
    pair = " ".join(part for part in (single, bos and f"{bos}:1", "$B:1", eos and f"{eos}:1") if part)
    used = [(token, backend.token_to_id(token)) for token in dict.fromkeys((bos, eos)) if token is not None]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=used)


class _GenerationTag(jinja2.ext.Extension):
    """Accepts `{% generation %}...{% endgeneration %}` (training markup) and renders its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _compile_template(source: str) -> jinja2.Template:
    """A chat template in the sandbox, with the helpers transformers gives templates."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # NOTE: jinja's own tojson escapes HTML characters, which would change the prompt. A filter's output
    # (`tools | map(attribute="function")`) is a generator: written as the list it yields.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys, default=list
    )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)
