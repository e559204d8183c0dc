"""Building tokenizers from GGUF metadata, checked against transformers' own GGUF loader."""

from __future__ import annotations

import logging
import unicodedata
from pathlib import Path
from typing import Any

import gguf
import pytest
from tokenizers import Regex, pre_tokenizers

from proto.gguf_header import read_gguf_metadata
from proto.gguf_pretokenizers import PRE_TOKENIZER_SPLITS
from proto.gguf_tokenizer import UnsupportedTokenizer, build_gguf_backend
from service.model_files.tokenizer import Tokenizer
from service.openai.answer import resolve_parsers

_TEXTS = ["hello the world  123456789", "it's   done\n\n\tok", "naïve café 你好 😀", "<|im_start|>user x"]


def _byte_alphabet_metadata(**overrides: Any) -> dict[str, Any]:
    """Metadata of a byte-level BPE whose vocabulary is just the 256 byte characters."""
    printable = [chr(b) for b in range(ord("!"), ord("~") + 1)]
    metadata = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": printable, "tokenizer.ggml.merges": []}
    return {**metadata, **overrides}


def test_other_tokenizer_models_are_refused_naming_the_supported_ones() -> None:
    with pytest.raises(UnsupportedTokenizer, match=r"'bert' is not supported; supported: 'gpt2', 'llama'"):
        build_gguf_backend(_byte_alphabet_metadata(**{"tokenizer.ggml.model": "bert"}))


def test_unknown_pre_tokenizer_warns_and_splits_as_llama_cpp_default(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        backend = build_gguf_backend(_byte_alphabet_metadata(**{"tokenizer.ggml.pre": "mystery-pre"}))
    assert "mystery-pre" in caplog.text
    assert backend.decode(backend.encode("a+b=c!").ids) == "a+b=c!"


def _vocab_cases(vocab_file: Path) -> list[tuple[str, list[int]]]:
    """llama.cpp's reference tokenizations of a vocabulary file, as test-tokenizer-0 reads them."""
    texts = vocab_file.with_suffix(".gguf.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    texts[-1] = texts[-1].removesuffix("\n__ggml_vocab_test__")
    lines = vocab_file.with_suffix(".gguf.out").read_text(encoding="utf-8").split("\n")
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, lines, strict=False)]


# NOTE: a BERT (WordPiece) vocabulary belongs to an embedding model, which zeroserve does not serve.
_NOT_DECODERS = {"ggml-vocab-bert-bge.gguf"}
_VOCAB_FILES = [
    "ggml-vocab-command-r.gguf",
    "ggml-vocab-deepseek-coder.gguf",
    "ggml-vocab-deepseek-llm.gguf",
    "ggml-vocab-falcon.gguf",
    "ggml-vocab-gemma-4.gguf",
    "ggml-vocab-gpt-2.gguf",
    "ggml-vocab-llama-bpe.gguf",
    "ggml-vocab-llama-spm.gguf",
    "ggml-vocab-mpt.gguf",
    "ggml-vocab-phi-3.gguf",
    "ggml-vocab-qwen2.gguf",
    "ggml-vocab-qwen35.gguf",
    "ggml-vocab-refact.gguf",
    "ggml-vocab-starcoder.gguf",
]


def test_every_reference_vocabulary_is_covered(llama_cpp_tree: Path) -> None:
    with_references = {p.name.removesuffix(".out") for p in (llama_cpp_tree / "models").glob("ggml-vocab-*.gguf.out")}
    assert with_references == set(_VOCAB_FILES) | _NOT_DECODERS


@pytest.mark.parametrize("name", _VOCAB_FILES)
def test_vocabulary_tokenizes_as_llama_cpp(llama_cpp_tree: Path, name: str) -> None:
    vocab_file = llama_cpp_tree / "models" / name
    backend = build_gguf_backend(read_gguf_metadata(vocab_file))
    cases = _vocab_cases(vocab_file)
    assert len(cases) >= 40
    wrong = [(text, ids) for text, ids in cases if backend.encode(text, add_special_tokens=False).ids != ids]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ from llama.cpp, first: {wrong[0][0]!r}"


@pytest.mark.parametrize("name", sorted(_NOT_DECODERS))
def test_encoder_vocabulary_is_refused_by_name(llama_cpp_tree: Path, name: str) -> None:
    with pytest.raises(UnsupportedTokenizer, match="'bert'"):
        build_gguf_backend(read_gguf_metadata(llama_cpp_tree / "models" / name))


def _write_variant(source: Path, target: Path, overrides: dict[str, Any]) -> None:
    """A tensor-less copy of `source`'s metadata with some keys replaced."""
    metadata = {**read_gguf_metadata(source), **overrides}
    writer = gguf.GGUFWriter(str(target), arch=metadata.pop("general.architecture"))
    for key, value in metadata.items():
        if isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_string(key, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.real_model
@pytest.mark.parametrize("pre", ["llama-bpe", "qwen2"])
def test_split_regex_variants_match_transformers(default_model_path: Path, tmp_path: Path, pre: str) -> None:
    from transformers import AutoTokenizer

    metadata = read_gguf_metadata(default_model_path)
    tokens, token_types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    token_types[1000] = 4  # a user-defined (added, not special) token
    tokens[tokens.index("Ġthe")] = " the"  # spelled as text, not in the byte alphabet
    overrides = {
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": token_types,
    }
    _write_variant(default_model_path, tmp_path / "variant.gguf", overrides)

    ours = Tokenizer.from_model(tmp_path / "variant.gguf")
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="variant.gguf")

    for text in _TEXTS:
        assert ours.encode(text, add_special_tokens=True) == theirs.encode(text)


# NOTE: gpt-oss's own split (o200k's, in its tokenizer.json), which llama.cpp rewrites for "gpt-4o"
# (src/llama-vocab.cpp quotes it there). Its rewrite leaves combining marks (\p{M}) out of words.
_O200K_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split(regexes: tuple[str, ...], text: str) -> list[str]:
    pieces = [text]
    for regex in regexes:
        splitter = pre_tokenizers.Split(Regex(regex), behavior="isolated")
        pieces = [piece for whole in pieces for piece, _ in splitter.pre_tokenize_str(whole)]
    return pieces


def test_gpt_4o_splits_as_gpt_oss_own_regex_but_for_combining_marks(llama_cpp_tree: Path) -> None:
    """No reference vocabulary of llama.cpp's is "gpt-4o" (gpt-oss's GGUF `tokenizer.ggml.pre`): its
    split regex is checked against the one it rewrites, on every reference text of the tree."""
    texts = [text for path in sorted((llama_cpp_tree / "models").glob("ggml-vocab-*.gguf.inp"))
             for text in path.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")]
    has_mark = [any(unicodedata.category(char).startswith("M") for char in text) for text in texts]
    assert len(texts) > 600 and 0 < sum(has_mark) < len(texts) // 5
    differing = [text for text in texts if _split(PRE_TOKENIZER_SPLITS["gpt-4o"], text) != _split((_O200K_SPLIT,), text)]
    assert differing and all(has_mark[texts.index(text)] for text in differing)


def test_a_gpt_oss_gguf_tokenizer_keeps_harmony_tokens_whole_and_chooses_harmony(
    default_model_path: Path, llama_cpp_tree: Path, tmp_path: Path
) -> None:
    """The default model's vocabulary as gpt-oss's GGUF declares its tokenizer: pre "gpt-4o", harmony's
    tokens as control tokens, gpt-oss's chat template."""
    metadata = read_gguf_metadata(default_model_path)
    tokens, token_types = metadata["tokenizer.ggml.tokens"], metadata["tokenizer.ggml.token_type"]
    harmony = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
    num_plain = len(tokens)
    tokens += harmony
    token_types += [3] * len(harmony)
    template = (llama_cpp_tree / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    overrides = {"tokenizer.ggml.pre": "gpt-4o", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": token_types,
                 "tokenizer.chat_template": template}
    _write_variant(default_model_path, tmp_path / "gpt-oss-like.gguf", overrides)
    tokenizer = Tokenizer.from_model(tmp_path / "gpt-oss-like.gguf")
    text = "<|start|>assistant<|channel|>final<|message|>It's 20 °C in Paris.<|return|>"
    ids = tokenizer.encode(text)
    assert [tokenizer.backend.id_to_token(i) for i in ids if i >= num_plain] == [
        "<|start|>", "<|channel|>", "<|message|>", "<|return|>"]
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    assert tokenizer.decode(ids) == "assistantfinalIt's 20 °C in Paris."
    assert resolve_parsers("auto", "auto", tokenizer.chat_template) == ("harmony", "harmony")
