"""Building a `tokenizers.Tokenizer` from the vocabulary a GGUF file carries in its metadata.

A GGUF has no tokenizer.json: it stores llama.cpp's `tokenizer.ggml.*` keys. This rebuilds
the tokenizer the way transformers does (`integrations/gguf/gguf_tokenizer_mapping.py`:
`byte_level_tokenizer`, `add_gguf_special_tokens`, `set_split_regex`), so the ids match
`AutoTokenizer.from_pretrained(folder, gguf_file=name)` exactly, without importing it:

    BPE(vocab, merges) -> added tokens (control: special, user-defined: plain)
      -> pre-tokenizer (split regex named by `tokenizer.ggml.pre`, then ByteLevel)
      -> ByteLevel decoder
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

from tokenizers import AddedToken, Regex, decoders, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

logger = logging.getLogger(__name__)

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_NAMED_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `tokenizer.ggml.pre` -> the regex that splits text before byte-level BPE
_PRE_TOKENIZER_SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"), _LLAMA3_SPLIT),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez"), _QWEN2_SPLIT),
}
# NOTE: these use GPT-2's own split, which plain `ByteLevel(use_regex=True)` applies.
_PLAIN_BYTE_LEVEL = frozenset({"default", "gpt-2", "smollm"})


def build_gguf_backend(metadata: dict[str, Any]) -> Backend:
    """The tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise NotImplementedError(
            f"GGUF tokenizer model {model!r} is not supported; only 'gpt2' (byte-level BPE) is."
        )
    if "tokenizer.ggml.merges" not in metadata:
        raise ValueError("This GGUF's byte-level BPE vocabulary has no tokenizer.ggml.merges.")
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    token_types: list[int] = metadata.get("tokenizer.ggml.token_type") or []
    spelling = _bytes_to_unicode()
    alphabet = frozenset(spelling.values())
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    merges = [tuple(merge.split(" ")) for merge in metadata["tokenizer.ggml.merges"]]
    backend = Backend(
        BPE(vocab, merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False)
    )
    backend.pre_tokenizer = _pre_tokenizer(metadata.get("tokenizer.ggml.pre"))
    backend.decoder = decoders.ByteLevel()
    _add_tokens(backend, metadata, tokens, token_types, alphabet)
    return backend


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    split = _PRE_TOKENIZER_SPLITS.get(pre or "default")
    if split is None:
        if pre not in _PLAIN_BYTE_LEVEL and pre is not None:
            logger.warning("Unknown GGUF pre-tokenizer %r; splitting text as GPT-2 does.", pre)
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def _add_tokens(
    backend: Backend,
    metadata: dict[str, Any],
    tokens: list[str],
    token_types: list[int],
    alphabet: frozenset[str],
) -> None:
    """Control tokens and the named BOS/EOS/UNK/PAD become special; user-defined ones plain.

    NOTE: a control token spelled outside the byte alphabet is a llama.cpp mislabel; adding it
    would grow the vocabulary past the model's, so (like transformers) it is skipped.
    """
    named = [tokens[i] for i in (_token_id(metadata, key) for key in _NAMED_TOKEN_KEYS) if i is not None]
    control = [t for t, kind in zip(tokens, token_types, strict=False) if kind == _CONTROL and set(t) <= alphabet]
    special = list(dict.fromkeys(named + control))
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    vocab = backend.get_vocab()
    user_defined = [t for t, kind in zip(tokens, token_types, strict=False) if kind == _USER_DEFINED and t in vocab]
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user_defined])


def _token_id(metadata: dict[str, Any], key: str) -> int | None:
    value = metadata.get(f"tokenizer.ggml.{key}")
    return None if value is None else int(value)


@cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level vocabularies are spelled in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in table)
    table.update({b: chr(256 + n) for n, b in enumerate(shifted)})
    return dict(sorted(table.items()))
