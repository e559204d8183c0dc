"""The k-quant, i-quant and MXFP4 forms (int4k_q8, int5k_q8, int6k_q8, iq4xs_q8, mxfp4_q8) held to the
bounds the form registry declares for them, on a real model: the default model with its FFN down projections
(rows of 1536, the only ones whose rows are whole 256-value super-blocks) quantized again, layer by layer in
turn to Q4_K, Q5_K, Q6_K, IQ4_XS and MXFP4 (benchmarks/real_size_ggufs.py's plain quantizers, llama.cpp's
block layouts; MXFP4 the bytes of llama.cpp's reference quantizer), served with default flags, against
transformers' float32 on the same file (which dequantizes the blocks). One file runs every form: one reference
to load and decode, where a file a form would take five (each form alone measured within the same bounds: the
README has the figures).

As test_fidelity_int4.py holds the default file's own forms: fed the reference's own greedy continuation
(teacher forcing), our most likely next token is the reference's at >= 90% of positions, the
reference's token is never below the registry's `max_rank` for the forms run, and not our top pick
only where the reference's own top two lie within its `near_tie_nats`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from unittest import mock

import gguf
import pytest
import torch
import transformers

from benchmarks.real_size_ggufs import requantize
from engine_proc.core import EngineCore
from engine_proc.cpu.features import cpu_features
from engine_proc.cpu.form_registry import FORMS
from engine_proc.cpu.kernels import load_cpu_kernels
from proto.engine_config import EngineConfig
from service.model_files.tokenizer import Tokenizer
from tests.engine_proc.fidelity_prompts import planned_forms, reference_margin, teacher_forced_ranks

K_QUANT_FORMS = {"Q4_K": "int4k_q8", "Q5_K": "int5k_q8", "Q6_K": "int6k_q8", "IQ4_XS": "iq4xs_q8", "MXFP4": "mxfp4_q8"}
# NOTE: fewer than the int4 test's 40 a prompt: four files, each with its own reference to load and decode.
NUM_REFERENCE_TOKENS = 24


def reference_of(path: Path, prompts: list[list[int]]) -> tuple[object, list[list[int]]]:
    """transformers' float32 model of the GGUF at `path`, and its greedy continuation of each prompt."""
    with (
        mock.patch("gguf.GGUFReader", functools.cache(gguf.GGUFReader)),
        mock.patch("gguf.get_tensor_name_map", functools.cache(gguf.get_tensor_name_map)),
    ):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
    eos_token_id = Tokenizer.from_model(path).eos_token_id
    continuations = []
    for prompt in prompts:
        with torch.no_grad():
            generated = model.generate(
                torch.tensor([prompt]), max_new_tokens=NUM_REFERENCE_TOKENS, do_sample=False,
                eos_token_id=eos_token_id, pad_token_id=eos_token_id,
            )
        continuations.append(generated[0, len(prompt):].tolist())
    return model, continuations


@pytest.mark.real_model
def test_the_k_quant_forms_hold_their_registry_bound_on_the_default_model(
    default_model_path: Path, chat_prompts: list[list[int]], tmp_path: Path,
) -> None:
    if load_cpu_kernels() is None:
        pytest.skip(f"the k-quant forms need x86 with AVX2 (or AVX-512 BF16 and VNNI) and g++ ({cpu_features().describe()})")
    path = tmp_path / "smollm2-ffn_down-k-quants.gguf"
    types = sorted(K_QUANT_FORMS)
    requantize(default_model_path, path, lambda name: (
        types[int(name.split(".")[1]) % len(types)] if name.endswith("ffn_down.weight") else None
    ))
    reference_model, references = reference_of(path, chat_prompts)
    core = EngineCore(EngineConfig(model_path=str(path), kv_cache_memory_gib=0.25, max_model_len=2048))
    forms_run = planned_forms(core)
    assert set(K_QUANT_FORMS.values()) <= forms_run, forms_run
    ranks = teacher_forced_ranks(core, chat_prompts, references)
    num_top1 = sum(rank == 1 for rank in ranks)
    assert num_top1 >= 0.9 * len(ranks), f"top-1 agreement {num_top1}/{len(ranks)}"
    assert max(ranks) <= max(FORMS[f].fidelity.max_rank for f in forms_run), f"ranks {ranks}"
    near_tie = max(FORMS[f].fidelity.near_tie_nats for f in forms_run)
    positions = [(i, j) for i, reference in enumerate(references) for j in range(len(reference))]
    margins = []
    for (i, j), rank in zip(positions, ranks, strict=True):
        if rank > 1:
            margins.append(reference_margin(reference_model, chat_prompts[i] + references[i][:j]))
            assert margins[-1] < near_tie, f"prompt {i} token {j}: rank {rank}, the reference leads by {margins[-1]:.3f}"
    print(f"k-quant forms: top-1 {num_top1}/{len(ranks)}, worst rank {max(ranks)}, widest margin missed {max(margins, default=0):.3f}")
