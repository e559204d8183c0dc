"""gpt-oss's own pieces against transformers': its gated activation, and a folder of MXFP4 experts (`*_blocks`,
`*_scales`, as the real models ship) written here from a tiny float one: in float32 the engine's greedy tokens equal
transformers' on it, and by default (bfloat16, the experts on their own blocks' kernel form) but at near ties."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.reference_models import (
    MAX_NEW_TOKENS,
    NEAR_TIE,
    TEXTS,
    Greedy,
    engine_greedy,
    first_difference_is_a_near_tie,
    transformers_greedy,
    write_hf_folder,
)
from engine_proc.core import EngineCore
from engine_proc.cpu.kernels import load_cpu_kernels
from engine_proc.cpu.weight_blocks import MXFP4Blocks
from engine_proc.loader import check_model
from engine_proc.models import gpt_oss
from engine_proc.models.gpt_oss import clamped_swiglu
from engine_proc.models.moe import SparseMoeBlock
from proto.engine_config import EngineConfig
from service.model_files.tokenizer import Tokenizer

# transformers' FP4_VALUES: what each 4-bit code of an MXFP4 folder stands for, before its block's 2^(scale − 127)
FP4_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def to_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks [..., rows, cols // 32, 16] uint8, scales [..., rows, cols // 32] uint8) of a weight [..., rows, cols]
    rounded to MXFP4 as gpt-oss's folders hold it: per 32 columns the least power of two that brings them within
    ±6, each the nearest FP4 value, two codes a byte (the even column in the low nibble)."""
    groups = weight.reshape(*weight.shape[:-1], -1, 32)
    exponents = torch.log2(groups.abs().amax(dim=-1) / 6).ceil().clamp(-127, 127)
    scaled = groups / torch.exp2(exponents).unsqueeze(-1)
    codes = (scaled.unsqueeze(-1) - FP4_VALUES).abs().argmin(dim=-1)
    return (codes[..., 0::2] | codes[..., 1::2] << 4).to(torch.uint8), (exponents + 127).to(torch.uint8)


def write_mxfp4_folder(float_folder: Path, target: Path) -> Path:
    """The float gpt-oss folder with its experts' projections as MXFP4 (their biases, and all else, as they were)."""
    shutil.copytree(float_folder, target)
    tensors = load_file(target / "model.safetensors")
    for name in [name for name in tensors if name.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales = to_mxfp4(tensors.pop(name).transpose(1, 2))  # NOTE: [experts, outputs, inputs]
        tensors |= {f"{name}_blocks": blocks, f"{name}_scales": scales}
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((target / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def folders(default_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a tiny float gpt-oss folder, the same with MXFP4 experts)."""
    root = tmp_path_factory.mktemp("gpt_oss")
    float_folder = write_hf_folder(root / "float", "gpt_oss", Tokenizer.from_model(default_model_path))
    return float_folder, write_mxfp4_folder(float_folder, root / "mxfp4")


@pytest.fixture(scope="module")
def mxfp4_reference(folders: tuple[Path, Path]) -> tuple[list[list[int]], Greedy]:
    """The prompts, and transformers' greedy continuations on the MXFP4 folder (its experts dequantized)."""
    from transformers import Mxfp4Config

    prompts = [Tokenizer.from_model(folders[1]).encode(text) for text in TEXTS]
    dequantized = Mxfp4Config(dequantize=True)
    return prompts, transformers_greedy(folders[1], prompts, MAX_NEW_TOKENS, quantization_config=dequantized)


def test_clamped_swiglu_is_transformers() -> None:
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    gate_up = torch.randn(5, 2 * 96, generator=torch.Generator().manual_seed(0)) * 6
    expected = GptOssExperts(GptOssConfig(intermediate_size=96))._apply_gate(gate_up)
    assert torch.equal(clamped_swiglu(gate_up[:, ::2], gate_up[:, 1::2]), expected)


def test_mxfp4_pairs_read_as_transformers_dequantizes_them() -> None:
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    weight = torch.randn(3, 48, 64, generator=torch.Generator().manual_seed(0))
    blocks, scales = to_mxfp4(weight)
    expected = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)
    ours = torch.stack([MXFP4Blocks.from_pairs(blocks[e], scales[e]).dequantize() for e in range(3)])
    assert torch.equal(ours, expected)


def test_the_folders_pass_the_engines_check(folders: tuple[Path, Path]) -> None:
    """Each expert's tensors named from the folders' headers alone, as the loader names them."""
    for folder in folders:
        check_model(folder)


def test_mxfp4_folder_equals_transformers_in_float32(
    folders: tuple[Path, Path], mxfp4_reference: tuple[list[list[int]], Greedy]
) -> None:
    prompts, expected = mxfp4_reference
    ours = engine_greedy(folders[1], prompts, MAX_NEW_TOKENS, dtype="float32")
    assert ours.token_ids == expected.token_ids
    assert sum(ours.logprobs, []) == pytest.approx(sum(expected.logprobs, []), abs=1e-4)


def test_mxfp4_folder_serves_with_default_flags_on_its_own_blocks(
    folders: tuple[Path, Path], mxfp4_reference: tuple[list[list[int]], Greedy]
) -> None:
    """bfloat16 with the experts on mxfp4_q8 where the kernels run: the reference's tokens but at near ties. The
    folder's other projections are bfloat16, which no row-invariant form runs: `/version` says so."""
    prompts, expected = mxfp4_reference
    core = EngineCore(EngineConfig(model_path=str(folders[1]), kv_cache_memory_gib=0.05, max_model_len=512))
    choices = core.ready_message().kernel_choices
    if load_cpu_kernels() is not None:
        assert "gate_up_proj: mxfp4_q8; down_proj: mxfp4_q8" in choices["linears"]
        assert choices["batch invariant"] == "no (matmuls and norms without a row-invariant kernel here)"
    assert first_difference_is_a_near_tie(engine_greedy(folders[1], prompts, MAX_NEW_TOKENS), expected, NEAR_TIE)


@pytest.mark.skipif(load_cpu_kernels() is None, reason="the experts' one call a layer is a C++ kernel")
def test_the_fused_experts_with_biases_and_the_clamped_swiglu_give_the_loops_bits(
    folders: tuple[Path, Path], mxfp4_reference: tuple[list[list[int]], Greedy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Default flags: a layer's MXFP4 experts, their biases and gpt-oss's gate in one C++ call, the loop's bits."""
    prompts, _ = mxfp4_reference
    core = EngineCore(EngineConfig(model_path=str(folders[1]), kv_cache_memory_gib=0.05, max_model_len=512))
    assert core.ready_message().kernel_choices["experts"] == "one C++ call a layer (moe_experts)"
    fused = engine_greedy(folders[1], prompts, MAX_NEW_TOKENS)
    monkeypatch.setattr(SparseMoeBlock, "fuse", lambda self, kernels: None)
    looped = engine_greedy(folders[1], prompts, MAX_NEW_TOKENS)
    assert fused.token_ids == looped.token_ids and fused.logprobs == looped.logprobs


@pytest.mark.parametrize(("pattern", "expected"), [(None, (True, False, True, False)), (3, (True, True, False, True)),
                                                   ([False, True, True, False], (False, True, True, False))])
def test_a_ggufs_layers_slide_as_llama_cpp_reads_them(pattern: int | list[bool] | None, expected: tuple[bool, ...]) -> None:
    """llama.cpp's gpt-oss: every other layer slides unless the file gives a pattern (a period, or each layer's);
    its YaRN ramp is gpt-oss's own, not truncated."""
    metadata = {"attention.sliding_window": 128, "attention.sliding_window_pattern": pattern, "expert_count": 32,
                "expert_used_count": 4}
    yarn = (("factor", 32.0), ("original_max_position_embeddings", 4096.0), ("rope_type", "yarn"), ("truncate", True))
    fields = gpt_oss.FAMILY.gguf_config(
        lambda key, default: default if metadata.get(key) is None else metadata[key],
        {"num_hidden_layers": 4, "intermediate_size": 2880, "rope_scaling": yarn},
    )
    assert (fields["sliding_window"], fields["sliding_layers"]) == (128, expected)
    assert dict(fields["rope_scaling"])["truncate"] is False
