"""Our Llama-family model against Hugging Face's, on tiny random checkpoints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine_proc.cpu.policy import FASTEST
from engine_proc.loader import load_model
from proto import envs
from tests.engine_proc.cpu.stand_in_timer import stand_in_timer
from tests.engine_proc.models.tiny_llama import CHECKPOINTS, TINY, run, save_tiny_checkpoint


@pytest.mark.parametrize("kind", sorted(CHECKPOINTS))
def test_logits_match_hugging_face(tmp_path: Path, kind: str) -> None:
    hf_model = save_tiny_checkpoint(tmp_path, kind)
    model = load_model(tmp_path, dtype="float32")
    prompt = torch.randint(0, TINY["vocab_size"], (40,))
    with torch.no_grad():
        expected = hf_model(prompt[None]).logits[0].float()
    logits = run(model, [prompt])
    assert logits.dtype == torch.float32
    assert logits.shape == (40, TINY["vocab_size"])
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["llama", "qwen3-qk-norm"])
def test_flat_batch_gives_each_sequence_its_own_logits(tmp_path: Path, kind: str) -> None:
    save_tiny_checkpoint(tmp_path, kind)
    model = load_model(tmp_path, dtype="float32")
    first, second = torch.randint(0, TINY["vocab_size"], (11,)), torch.randint(0, TINY["vocab_size"], (6,))
    batched = run(model, [first, second])
    torch.testing.assert_close(batched[:11], run(model, [first]), atol=1e-5, rtol=0)
    torch.testing.assert_close(batched[11:], run(model, [second]), atol=1e-5, rtol=0)


def test_loads_in_bfloat16_and_still_returns_float32_logits(tmp_path: Path) -> None:
    hf_model = save_tiny_checkpoint(tmp_path, "llama")
    model = load_model(tmp_path, dtype=torch.bfloat16)
    assert {param.dtype for param in model.parameters()} == {torch.bfloat16}
    prompt = torch.randint(0, TINY["vocab_size"], (12,))
    with torch.no_grad():
        expected = hf_model(prompt[None]).logits[0]
    logits = run(model, [prompt])
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, expected, atol=0.05, rtol=0)


def test_checkpoint_missing_a_tensor_is_rejected_by_name(tmp_path: Path) -> None:
    save_tiny_checkpoint(tmp_path, "llama")
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"missing model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(tmp_path)


def test_checkpoint_with_a_misshaped_tensor_is_rejected(tmp_path: Path) -> None:
    save_tiny_checkpoint(tmp_path, "llama")
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, 64)
    weights["model.extra.weight"] = torch.zeros(1)
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"unexpected model\.extra\.weight"):
        load_model(tmp_path)
    del weights["model.extra.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"k_proj\.weight: checkpoint shape \(8, 64\)"):
        load_model(tmp_path)


def test_every_output_head_form_gives_the_same_logits(tmp_path: Path) -> None:
    save_tiny_checkpoint(tmp_path, "llama")
    model = load_model(tmp_path, dtype=torch.bfloat16)
    model.set_int8_lm_head(model.lm_head_weight.float())
    model.prepack()
    assert model.head is not None
    hidden = torch.randn(100, TINY["hidden_size"]).bfloat16()
    expected = torch.nn.functional.linear(hidden, model.lm_head_weight).float()
    assert "int8" in model.head.runs and len(model.head.runs) >= 3  # int8 and dense, packed or float32
    with torch.no_grad():
        for form in model.head.runs:
            model.head.plan = ((sys.maxsize, form),)
            for num_rows in (3, 64, 100):
                # NOTE: int8 rows round each weight to 1/254 of its row's largest.
                tolerance = 0.05 if form == "int8" else 0.02
                torch.testing.assert_close(
                    model.compute_logits(hidden[:num_rows]), expected[:num_rows], rtol=tolerance, atol=tolerance
                )
        model.unpack()
        assert model.head is None
        torch.testing.assert_close(model.compute_logits(hidden), expected, rtol=0, atol=0)


@pytest.mark.parametrize("is_int8_faster", [True, False])
def test_int8_output_head_is_kept_only_where_it_measures_faster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, is_int8_faster: bool
) -> None:
    save_tiny_checkpoint(tmp_path, "llama")
    model = load_model(tmp_path, dtype=torch.bfloat16)
    hidden = torch.randn(2, TINY["hidden_size"]).bfloat16()
    expected = torch.nn.functional.linear(hidden, model.lm_head_weight).float()
    model.set_int8_lm_head(model.lm_head_weight.float())

    stand_in_timer(monkeypatch, lambda form: 0.5 if (form == "int8") is is_int8_faster else 1.0)
    monkeypatch.setenv("ZEROSERVE_PLAN_CACHE", "off")  # NOTE: timed anew, not a plan saved by the other case
    envs.read.cache_clear()
    model.prepack(FASTEST)
    envs.read.cache_clear()
    assert model.head is not None
    assert ("int8" in model.head.runs) is is_int8_faster
    assert (model.choices["head"] == "int8") is is_int8_faster
    with torch.no_grad():
        torch.testing.assert_close(model.compute_logits(hidden), expected, rtol=0.05, atol=0.05)
