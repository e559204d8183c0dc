"""Every layer in one C++ call (the kernels' `DecoderLayers`) for steps of one-token decodes: with default flags,
the same tokens and logprob bits as the layers run one by one from Python, on the default model and on shapes whose
pieces differ (a fused projection of two block types, a QKV bias, per-head q/k norms). Two threads, so the call runs
as one parallel region that shares each projection between them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.real_size_ggufs import Shape, write
from benchmarks.reference_models import engine_greedy
from engine_proc.attention import PagedAttention
from engine_proc.core import EngineCore
from engine_proc.cpu.kernels import load_cpu_kernels
from engine_proc.models.llama import LlamaForCausalLM
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.model_files.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(load_cpu_kernels() is None, reason="the fused layers are zeroserve's C++ kernels")

TEXTS = [f"Question {i}: what is {i} plus {2 * i}? Answer:" for i in range(16)]
MAX_NEW_TOKENS = 8
# (architecture, block type, other types by kind, QKV bias, per-head q/k norms)
SHAPES = {
    "llama-q4_k-v-q6_k": (Shape(256, 2, 512, 4, 2, 64, is_tied=True), "Q4_K", {"attn_v": "Q6_K"}),
    "qwen2-qkv-bias-q8_0": (Shape(256, 2, 512, 4, 2, 64, is_tied=True, has_qkv_bias=True, architecture="qwen2"), "Q8_0", {}),
    "qwen3-qk-norm-q4_0": (Shape(256, 2, 512, 4, 2, 64, is_tied=False, architecture="qwen3", has_qk_norm=True), "Q4_0", {}),
}


def _fused_and_looped(path: Path, prompts: list[list[int]], monkeypatch: pytest.MonkeyPatch) -> None:
    core = EngineCore(EngineConfig(model_path=str(path), kv_cache_memory_gib=0.05, max_model_len=512, num_threads=2))
    claims = core.ready_message().kernel_choices
    assert claims["decode"] == "one C++ call for all layers (decoder_layers)" and claims["batch invariant"] == "yes"
    assert core.model_runner.model.fused_layers.num_threads == 2
    num_fused = 0
    decode_step = PagedAttention.decode_step

    def counted(self: PagedAttention, group: int) -> Any:
        nonlocal num_fused
        step = decode_step(self, group)
        num_fused += step is not None
        return step

    monkeypatch.setattr(PagedAttention, "decode_step", counted)
    fused = engine_greedy(path, prompts, MAX_NEW_TOKENS, num_threads=2)
    assert num_fused >= MAX_NEW_TOKENS - 2  # every step after the prompts' (a step or two of 256 tokens)
    monkeypatch.setattr(LlamaForCausalLM, "_fuse_layers", lambda self, kernels: None)
    looped = engine_greedy(path, prompts, MAX_NEW_TOKENS, num_threads=2)
    assert fused.token_ids == looped.token_ids and fused.logprobs == looped.logprobs


def test_the_default_model_decodes_the_same_bits_in_one_call(default_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = Tokenizer.from_model(default_model_path)
    _fused_and_looped(default_model_path, [tokenizer.encode(text) for text in TEXTS], monkeypatch)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_each_layer_shape_decodes_the_same_bits_in_one_call(
    name: str, tmp_path: Path, default_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape, ggml_type, types = SHAPES[name]
    path = tmp_path / f"{name}.gguf"
    write(shape, ggml_type, path, types=types)
    tokenizer = Tokenizer.from_model(default_model_path)
    _fused_and_looped(path, [tokenizer.encode(text) for text in TEXTS], monkeypatch)


def test_the_shared_call_gives_the_serial_calls_bits(default_model_path: Path) -> None:
    """The region of two threads against the same layers run kernel by kernel (each kernel's own threads), on 3
    decodes of different lengths."""
    core = EngineCore(EngineConfig(model_path=str(default_model_path), kv_cache_memory_gib=0.05, max_model_len=512, num_threads=2))
    model = core.model_runner.model
    fused = model.fused_layers
    outputs: dict[str, list[torch.Tensor]] = {"shared": [], "serial": []}

    class Both:
        def __call__(self, hidden: torch.Tensor, *args: Any) -> Any:
            for name, run in (("serial", fused.serial), ("shared", fused)):
                # NOTE: the residual is updated in place, and the cache written: each run from the same start.
                outputs[name].append(torch.cat(run(hidden.clone(), *args), dim=-1))
            return fused(hidden, *args)

    model.fused_layers = Both()
    tokenizer = Tokenizer.from_model(default_model_path)
    prompts = [tokenizer.encode(text) for text in (TEXTS[0], TEXTS[1] * 3, TEXTS[2] * 7)]
    for i, prompt in enumerate(prompts):
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        core.add_request(EngineCoreRequest(str(i), prompt, params))
    while core.has_work:
        core.step()
    assert len(outputs["shared"]) >= 3
    for shared, serial in zip(outputs["shared"], outputs["serial"], strict=True):
        assert torch.equal(shared, serial)
