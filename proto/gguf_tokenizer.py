"""Building a `tokenizers.Tokenizer` from the vocabulary a GGUF file carries in its metadata.

A GGUF has no tokenizer.json: it stores llama.cpp's `tokenizer.ggml.*` keys. Each tokenizer
model llama.cpp names is rebuilt from them so the ids match llama.cpp's own tokenizer:

    gpt2    byte-level BPE: vocab + merges, llama.cpp's split regexes for `tokenizer.ggml.pre`
    llama   SentencePiece BPE: merges ranked by the scores, "▁" for spaces, <0xXX> byte fallback
    gemma4  BPE on raw UTF-8 with merges, "▁" for spaces, split only at newlines

then the control tokens (special) and user-defined ones (plain) as added tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
from collections.abc import Callable
from functools import cache
from operator import methodcaller
from typing import Any

import ormsgpack
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
from tokenizers import Tokenizer as Backend
from tokenizers.models import BPE

from proto.envs import cache_dir
from proto.gguf_pretokenizers import BOS_BY_DEFAULT, IGNORE_MERGES, PRE_TOKENIZER_SPLITS
from proto.model_support import TOKENIZER_MODELS

logger = logging.getLogger(__name__)

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_NAMED_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")
_SPACE = "▁"


class UnsupportedTokenizer(ValueError):
    """A GGUF whose tokenizer model zeroserve cannot rebuild."""


def build_gguf_backend(metadata: dict[str, Any]) -> Backend:
    """The tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata."""
    model = metadata.get("tokenizer.ggml.model")
    build = _BUILDERS.get(model)  # type: ignore[arg-type]
    if build is None:
        supported = ", ".join(f"'{name}'" for name in _BUILDERS)
        raise UnsupportedTokenizer(f"GGUF tokenizer model {model!r} is not supported; supported: {supported}.")
    return build(metadata)


def adds_bos_eos(metadata: dict[str, Any]) -> tuple[bool, bool]:
    """Whether encoding with special tokens puts BOS before and EOS after, as llama.cpp decides."""
    model, pre = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.pre")
    # NOTE: llama.cpp's defaults when the file does not say: SentencePiece and Llama 3's BPE add BOS.
    add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama" or pre in BOS_BY_DEFAULT))
    add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    return add_bos or model == "gemma4", add_eos


def _byte_level_bpe(metadata: dict[str, Any]) -> Backend:
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    token_types: list[int] = metadata.get("tokenizer.ggml.token_type") or []
    spelling = _bytes_to_unicode()
    is_spelled = _byte_alphabet().fullmatch
    # NOTE: user-defined tokens ("  " in MPT's vocabulary) are matched as text, so keep their spelling.
    raw = {index for index, kind in enumerate(token_types) if kind == _USER_DEFINED}
    vocab = {
        token if is_spelled(token) or index in raw else "".join(spelling[b] for b in token.encode("utf-8")): index
        for index, token in enumerate(tokens)
    }
    pre = metadata.get("tokenizer.ggml.pre")
    backend = Backend(BPE(vocab, _merges(metadata), dropout=None, fuse_unk=False, ignore_merges=pre in IGNORE_MERGES))
    splits = _pre_tokenizer_splits(pre)
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [*(pre_tokenizers.Split(Regex(split), behavior="isolated") for split in splits)]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    _add_tokens(backend, metadata, vocab, lambda token: is_spelled(token) is not None)
    return backend


def _sentencepiece_bpe(metadata: dict[str, Any]) -> Backend:
    """llama.cpp's SPM tokenizer: merge the adjacent pair whose join scores highest, as HF BPE ranks."""
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    scores: list[float] = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {token: index for index, token in enumerate(tokens)}
    backend = Backend(
        BPE(vocab, _merges_by_score(tokens, scores, vocab), unk_token=_unknown_token(metadata), byte_fallback=True)
    )
    add_space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    steps: list[normalizers.Normalizer] = [normalizers.Replace(" ", _SPACE)]
    if add_space_prefix:
        steps.insert(0, normalizers.Prepend(_SPACE))
    backend.normalizer = normalizers.Sequence(steps)
    backend.decoder = _sentencepiece_decoder(strip_first_space=add_space_prefix)
    _add_tokens(backend, metadata, vocab, lambda token: True)
    return backend


def _utf8_bpe(metadata: dict[str, Any]) -> Backend:
    """Gemma 4's BPE: merges over raw UTF-8 where spaces are "▁", pieces split only at newlines."""
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    vocab = {token: index for index, token in enumerate(tokens)}
    backend = Backend(BPE(vocab, _merges(metadata), unk_token=_unknown_token(metadata), byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", _SPACE)
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|[\n]+"), behavior="isolated")
    backend.decoder = _sentencepiece_decoder(strip_first_space=False)
    _add_tokens(backend, metadata, vocab, lambda token: True)
    return backend


_BUILDERS: dict[str, Callable[[dict[str, Any]], Backend]] = dict(
    zip(TOKENIZER_MODELS, (_byte_level_bpe, _sentencepiece_bpe, _utf8_bpe), strict=True)
)


def _merges(metadata: dict[str, Any]) -> list[tuple[str, str]]:
    if "tokenizer.ggml.merges" not in metadata:
        raise UnsupportedTokenizer("This GGUF's BPE vocabulary has no tokenizer.ggml.merges.")
    return list(map(tuple, map(methodcaller("split", " ", 1), metadata["tokenizer.ggml.merges"])))


def _merges_by_score(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, ranked by the joined token's score (highest first), kept
    in the cache folder once found (Gemma's 262k-token vocabulary takes 1.9 s to search, 0.1 to read).

    NOTE: llama.cpp joins the highest-scoring adjacent pair, leftmost on ties; HF BPE joins the
    lowest-ranked one, leftmost on ties, so ranking by score gives the same tokens.
    """
    path = cache_dir() / "tokenizers" / f"{hashlib.sha256(ormsgpack.packb([tokens, scores])).hexdigest()}.msgpack"
    with contextlib.suppress(OSError, ormsgpack.MsgpackDecodeError):
        return list(map(tuple, ormsgpack.unpackb(path.read_bytes())))
    merges = _search_merges(tokens, scores, vocab)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(ormsgpack.packb(merges))
        os.replace(partial, path)
    return merges


def _search_merges(tokens: list[str], scores: list[float], vocab: dict[str, int]) -> list[tuple[str, str]]:
    merges: list[tuple[float, int, str, str]] = []
    for index, token in enumerate(tokens):
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                merges.append((-scores[index], index, left, right))
    merges.sort(key=lambda merge: (merge[0], merge[1]))
    return [(left, right) for _, _, left, right in merges]


def _sentencepiece_decoder(strip_first_space: bool) -> decoders.Decoder:
    steps = [decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip_first_space:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    return decoders.Sequence(steps)


def _pre_tokenizer_splits(pre: str | None) -> tuple[str, ...]:
    splits = PRE_TOKENIZER_SPLITS.get(pre or "default")
    if splits is None:
        logger.warning("Unknown GGUF pre-tokenizer %r; splitting text as llama.cpp's default does.", pre)
        return PRE_TOKENIZER_SPLITS["default"]
    return splits


def _unknown_token(metadata: dict[str, Any]) -> str | None:
    index = _token_id(metadata, "unknown_token_id")
    return None if index is None else metadata["tokenizer.ggml.tokens"][index]


def _add_tokens(
    backend: Backend, metadata: dict[str, Any], vocab: dict[str, int], is_spelled: Callable[[str], bool]
) -> None:
    """Control tokens and the named BOS/EOS/UNK/PAD become special; user-defined ones plain.

    NOTE: a control token spelled outside the byte alphabet is a llama.cpp mislabel; adding it
    would grow the vocabulary past the model's, so (like transformers) it is skipped.
    """
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    token_types: list[int] = metadata.get("tokenizer.ggml.token_type") or []
    named = [tokens[i] for i in (_token_id(metadata, key) for key in _NAMED_TOKEN_KEYS) if i is not None]
    control = [t for t, kind in zip(tokens, token_types, strict=False) if kind == _CONTROL and is_spelled(t)]
    special = list(dict.fromkeys(named + control))
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
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


@cache
def _byte_alphabet() -> re.Pattern[str]:
    """Matches text spelled wholly in GPT-2's byte alphabet."""
    return re.compile("[" + re.escape("".join(_bytes_to_unicode().values())) + "]*")
