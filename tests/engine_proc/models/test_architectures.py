"""Each architecture, as a Hugging Face folder and as the F32 GGUF llama.cpp's converter makes of it:
in float32, zeroserve's greedy tokens equal transformers', token for token."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sentencepiece
from transformers import PreTrainedTokenizerFast

from benchmarks.reference_models import (
    ARCHITECTURES,
    MAX_NEW_TOKENS,
    NEAR_TIE,
    SENTENCEPIECE_ARCHITECTURES,
    SLIDING_WINDOW,
    TEXTS,
    Greedy,
    convert_to_gguf,
    engine_greedy,
    first_difference_is_a_near_tie,
    transformers_greedy,
    write_hf_folder,
)
from benchmarks.tokenizer_corpus import tokenizer_corpus
from engine_proc.core import EngineCore
from engine_proc.cpu.kernels import load_cpu_kernels
from proto.engine_config import EngineConfig
from service.model_files.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(default_model_path: Path) -> Tokenizer:
    return Tokenizer.from_model(default_model_path)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def model_files(
    request: pytest.FixtureRequest, tokenizer: Tokenizer, llama_cpp_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, list[list[int]], Greedy]:
    """(folder, its F32 GGUF, the prompts, transformers' greedy continuations of them)."""
    root = tmp_path_factory.mktemp(request.param)
    own = None if request.param in SENTENCEPIECE_ARCHITECTURES else tokenizer
    folder = write_hf_folder(root / request.param, request.param, own)
    gguf_path = convert_to_gguf(folder, root / f"{request.param}-f32.gguf", llama_cpp_tree)
    prompts = [Tokenizer.from_model(folder).encode(text) for text in TEXTS]
    return folder, gguf_path, prompts, transformers_greedy(folder, prompts, MAX_NEW_TOKENS)


@pytest.mark.parametrize("source", ["folder", "f32 gguf"])
def test_greedy_equals_transformers(model_files: tuple[Path, Path, list[list[int]], Greedy], source: str) -> None:
    """Token for token, and each token's log-probability to float32 rounding."""
    folder, gguf_path, prompts, expected = model_files
    ours = engine_greedy(folder if source == "folder" else gguf_path, prompts, MAX_NEW_TOKENS, dtype="float32")
    assert ours.token_ids == expected.token_ids
    flat_ours, flat_expected = sum(ours.logprobs, []), sum(expected.logprobs, [])
    assert flat_ours == pytest.approx(flat_expected, abs=1e-4)


# NOTE: a mixture-of-experts model's rounded weights and activations move its router logits too: where a
# token's last chosen expert led the first unchosen one by less than this (logits) in some layer, the
# other expert may run for it, and the text from there on differs (OLMoE's Q8_0 file: 0.02).
ROUTER_NEAR_TIE = 0.05


# NOTE: an F16 file runs every family's layers on the same torch forms of bfloat16 weights: the families with
# layers of their own (Gemma 3's, Phi-3's fused tensors, Qwen's biases and norms, a mixture of experts)
# check it; the others' F16 files would repeat those checks (their Q8_0 files and folders are checked).
F16_CHECKED = ("gemma3", "llama", "mistral", "phi3", "qwen2", "qwen3", "qwen3_moe")


def test_converted_q8_0_file_serves_with_default_flags(
    model_files: tuple[Path, Path, list[list[int]], Greedy], llama_cpp_tree: Path, tmp_path: Path
) -> None:
    """llama.cpp's converter's Q8_0 file, run as `zeroserve serve` runs it (bfloat16 on the kernel forms
    where the CPU has them): the reference's greedy tokens but at near ties."""
    _serves_with_default_flags(model_files, llama_cpp_tree, tmp_path, "q8_0")


@pytest.mark.parametrize("model_files", F16_CHECKED, indirect=True)
def test_converted_f16_file_serves_with_default_flags(
    model_files: tuple[Path, Path, list[list[int]], Greedy], llama_cpp_tree: Path, tmp_path: Path
) -> None:
    """The converter's F16 file, as above."""
    _serves_with_default_flags(model_files, llama_cpp_tree, tmp_path, "f16")


def _serves_with_default_flags(
    model_files: tuple[Path, Path, list[list[int]], Greedy], llama_cpp_tree: Path, tmp_path: Path, outtype: str
) -> None:
    folder, _, prompts, expected = model_files
    path = convert_to_gguf(folder, tmp_path / f"model-{outtype}.gguf", llama_cpp_tree, outtype)
    assert first_difference_is_a_near_tie(engine_greedy(path, prompts, MAX_NEW_TOKENS), expected, NEAR_TIE, ROUTER_NEAR_TIE)


def test_folder_rounded_to_q8_0_at_load(model_files: tuple[Path, Path, list[list[int]], Greedy]) -> None:
    """`--quantization q8_0` on a float folder: the reference's greedy tokens but at near ties."""
    folder, _, prompts, expected = model_files
    ours = engine_greedy(folder, prompts, MAX_NEW_TOKENS, quantization="q8_0")
    assert first_difference_is_a_near_tie(ours, expected, NEAR_TIE, ROUTER_NEAR_TIE)


def test_mistral_folder_with_a_sliding_window_equals_transformers(tokenizer: Tokenizer, tmp_path: Path) -> None:
    """Mistral v0.1's window (every layer slides) in a folder: attended as transformers attends it,
    past the window."""
    folder = write_hf_folder(tmp_path / "mistral", "mistral", tokenizer, sliding_window=SLIDING_WINDOW)
    prompts = [tokenizer.encode(text) for text in TEXTS]
    expected = transformers_greedy(folder, prompts, MAX_NEW_TOKENS)
    ours = engine_greedy(folder, prompts, MAX_NEW_TOKENS, dtype="float32")
    assert ours.token_ids == expected.token_ids
    assert sum(ours.logprobs, []) == pytest.approx(sum(expected.logprobs, []), abs=1e-4)


def test_gemma3_with_linear_rope_scaling_equals_transformers(llama_cpp_tree: Path, tmp_path: Path) -> None:
    """Gemma 3 4B-27B's rope: its global layers' positions scaled linearly (factor 8), its local layers'
    not; from the folder and from llama.cpp's conversion of it."""
    rope_scaling: Any = {"rope_type": "linear", "factor": 8.0}
    folder = write_hf_folder(tmp_path / "gemma3", "gemma3", None, rope_scaling=rope_scaling)
    prompts = [Tokenizer.from_model(folder).encode(text) for text in TEXTS]
    expected = transformers_greedy(folder, prompts, MAX_NEW_TOKENS)
    unscaled = transformers_greedy(write_hf_folder(tmp_path / "plain", "gemma3"), prompts, MAX_NEW_TOKENS)
    assert unscaled.logprobs != expected.logprobs  # NOTE: the scaling changes what the model computes
    gguf_path = convert_to_gguf(folder, tmp_path / "gemma3-f32.gguf", llama_cpp_tree)
    for source in (folder, gguf_path):
        ours = engine_greedy(source, prompts, MAX_NEW_TOKENS, dtype="float32")
        assert ours.token_ids == expected.token_ids, source
        assert sum(ours.logprobs, []) == pytest.approx(sum(expected.logprobs, []), abs=1e-4), source


def test_gguf_tokenizer_equals_the_folders(model_files: tuple[Path, Path, list[list[int]], Greedy]) -> None:
    """The converted file's vocabulary, rebuilt from GGUF metadata, splits the corpus as the folder's own
    tokenizer does: its SentencePiece model where it has one (what the model was trained with; transformers
    5's tokenizer.json for it splits leading spaces otherwise), else its tokenizer.json."""
    folder, gguf_path, _, _ = model_files
    ours = Tokenizer.from_model(gguf_path)
    if (folder / "tokenizer.model").is_file():
        reference: Callable[[str], list[int]] = _sentencepiece_parsing_special(folder / "tokenizer.model")
    else:
        fast = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        reference = functools.partial(fast.encode, add_special_tokens=False)
    corpus = tokenizer_corpus()
    wrong = [text for text in corpus if ours.encode(text) != reference(text)]
    assert not wrong, f"{len(wrong)} of {len(corpus)} differ, first: {wrong[0]!r}"


def _sentencepiece_parsing_special(model_file: Path) -> Callable[[str], list[int]]:
    """SentencePiece's own ids, with control and unknown tokens' text taken as those tokens (as a server
    must, for chat templates; SentencePiece itself spells them out), each stretch of text between encoded
    on its own: llama.cpp's rule for the text after a special token."""
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    specials = {
        processor.id_to_piece(i): i
        for i in range(processor.get_piece_size())
        if processor.is_control(i) or processor.is_unknown(i)
    }
    pattern = re.compile("|".join(map(re.escape, sorted(specials, key=len, reverse=True))))

    def encode(text: str) -> list[int]:
        ids: list[int] = []
        start = 0
        for match in pattern.finditer(text):
            ids += processor.encode(text[start : match.start()]) + [specials[match.group()]]
            start = match.end()
        return ids + processor.encode(text[start:])

    return encode


def test_a_model_with_windowed_layers_is_batch_invariant_as_the_others_are(
    model_files: tuple[Path, Path, list[list[int]], Greedy],
) -> None:
    """`/version`'s claim and what it promises, for the folder rounded to Q8_0 at load (bfloat16 on the kernel
    forms where the CPU has them): the attention kernel starts each row at its window's first key, so Gemma 3's
    local layers (a window shorter than the prompts) claim what the others do, and each prompt gets the same
    tokens and log-probabilities, bit for bit, alone and beside the others."""
    folder, _, prompts, _ = model_files
    core = EngineCore(EngineConfig(model_path=str(folder), kv_cache_memory_gib=0.05, max_model_len=512, quantization="q8_0"))
    claim = core.ready_message().kernel_choices["batch invariant"]
    if load_cpu_kernels() is None:
        assert claim.startswith("no (") and "window" not in claim, claim
        return
    assert claim == "yes", claim
    together = engine_greedy(folder, prompts, MAX_NEW_TOKENS, quantization="q8_0")
    for i, prompt in enumerate(prompts):
        alone = engine_greedy(folder, [prompt], MAX_NEW_TOKENS, quantization="q8_0")
        assert (alone.token_ids[0], alone.logprobs[0]) == (together.token_ids[i], together.logprobs[i]), i
