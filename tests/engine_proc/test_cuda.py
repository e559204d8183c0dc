"""The engine on a CUDA GPU: the default model against transformers on the same GPU, the KV cache
sized from free GPU memory, and batching that leaves each request's tokens alone.

Skipped where torch sees no GPU; `python -m benchmarks.gpu_check OUT_DIR` runs this module on a GPU machine.
bfloat16 (the default there) is held to the bounds of the weight-only CPU forms
(test_fidelity_int4.py): fed transformers' own float32 greedy continuation, our most likely next
token is its token at >= 90% of positions and its token is never below our rank 3.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine_proc.core import EngineCore
from engine_proc.kv_cache_memory import free_memory_bytes
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from service.model_files.tokenizer import Tokenizer
from tests.engine_proc.fidelity_prompts import MAX_NEW_TOKENS, run, teacher_forced_ranks

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)

CUDA = torch.device("cuda")


@pytest.fixture(scope="module")
def cuda_reference(
    default_model_path: Path, chat_prompts: list[list[int]]
) -> tuple[Any, list[list[int]]]:
    """transformers' float32 model of the default GGUF on the GPU, and its greedy continuations."""
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(
        default_model_path.parent, gguf_file=default_model_path.name, dtype=torch.float32
    )
    model = model.to(CUDA).eval()
    eos_token_id = Tokenizer.from_model(default_model_path).eos_token_id
    continuations = []
    for prompt in chat_prompts:
        with torch.no_grad():
            generated = model.generate(
                torch.tensor([prompt], device=CUDA), max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                eos_token_id=eos_token_id, pad_token_id=eos_token_id,
            )
        continuations.append(generated[0, len(prompt):].tolist())
    return model, continuations


def top_two_gap(model: Any, token_ids: list[int]) -> float:
    """How far apart the reference's two most likely next tokens are after `token_ids` (nats)."""
    with torch.no_grad():
        logits = model(torch.tensor([token_ids], device=CUDA)).logits[0, -1].float()
    top = torch.log_softmax(logits, -1).topk(2).values
    return float(top[0] - top[1])


@pytest.mark.real_model
def test_float32_greedy_tokens_equal_transformers_on_the_gpu(
    default_model_path: Path, chat_prompts: list[list[int]], cuda_reference: tuple[Any, list[list[int]]]
) -> None:
    model, references = cuda_reference
    core = EngineCore(EngineConfig(
        model_path=str(default_model_path), device="cuda", dtype="float32", kv_cache_memory_gib=1,
        max_model_len=2048,
    ))
    assert core.model_runner.device.type == "cuda"
    ours = run(core, chat_prompts, SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS))
    for i, (prompt, reference) in enumerate(zip(chat_prompts, references, strict=True)):
        tokens = ours[str(i)]
        if tokens != reference:
            at = next(j for j, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b)
            gap = top_two_gap(model, prompt + reference[:at])
            pytest.fail(f"prompt {i} departs at token {at}: ours {tokens[at]}, transformers' "
                        f"{reference[at]} (its top two {gap:.4f} nats apart)")
    assert "Paris" in Tokenizer.from_model(default_model_path).decode(ours["0"])


@pytest.mark.real_model
def test_default_bfloat16_follows_transformers_on_the_gpu(
    default_model_path: Path, chat_prompts: list[list[int]], cuda_reference: tuple[Any, list[list[int]]]
) -> None:
    _, references = cuda_reference
    core = EngineCore(EngineConfig(
        model_path=str(default_model_path), kv_cache_memory_gib=1, max_model_len=2048,
    ))
    assert core.model_runner.device.type == "cuda"  # NOTE: device "auto" picks the GPU
    assert core.model_runner.dtype == (torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    assert core.model_runner.kernel_choices["attention"] == "torch SDPA"
    ranks = teacher_forced_ranks(core, chat_prompts, references)
    agreement = sum(rank == 1 for rank in ranks) / len(ranks)
    print(f"bfloat16 on {torch.cuda.get_device_name()}: top-1 agreement {agreement:.3f} "
          f"({sum(rank == 1 for rank in ranks)}/{len(ranks)}), worst rank {max(ranks)}")
    assert agreement >= 0.9
    assert max(ranks) <= 3
    free = run(core, chat_prompts, SamplingParams(temperature=0.0, max_tokens=8))
    assert "Paris" in Tokenizer.from_model(default_model_path).decode(free["0"])


@pytest.mark.real_model
def test_kv_cache_takes_its_share_of_free_gpu_memory(default_model_path: Path) -> None:
    torch.cuda.empty_cache()
    free_before = free_memory_bytes(CUDA)
    core = EngineCore(EngineConfig(model_path=str(default_model_path), max_model_len=2048))
    runner = core.model_runner
    cache_bytes = sum(t.numel() * t.element_size() for t in runner.attention.kv_caches)
    # NOTE: 90% of what was free once the weights were in (a few hundred MiB of a GPU's GiBs).
    assert 0.8 * free_before < cache_bytes <= 0.9 * free_before
    assert core.scheduler.kv_cache_manager.num_blocks == runner.num_kv_blocks
    outputs = run(core, [[1, 2, 3, 4]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert len(outputs["0"]) == 4
    del core, runner
    torch.cuda.empty_cache()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batched_requests_equal_each_alone_on_the_gpu(tiny_model_dir: Path, dtype: str) -> None:
    prompts = [list(range(100 + i, 100 + i + n)) for i, n in enumerate([3, 17, 40, 5, 64, 1, 200, 33])]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, seed=7, max_tokens=12, ignore_eos=True),
    ]

    def config() -> EngineConfig:
        return EngineConfig(model_path=str(tiny_model_dir), device="cuda", dtype=dtype, kv_cache_memory_gib=0.05)

    alone = []
    for i, prompt in enumerate(prompts):
        alone.append(run(EngineCore(config()), [prompt], params[i % 2])["0"])
    core = EngineCore(config())
    for i, prompt in enumerate(prompts):
        core.add_request(EngineCoreRequest(str(i), prompt, params[i % 2]))
    batched: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    while core.has_work:
        for output in core.step().outputs:
            batched[output.request_id] += output.new_token_ids
    assert [batched[str(i)] for i in range(len(prompts))] == alone
    manager = core.scheduler.kv_cache_manager
    assert manager.num_free_blocks == manager.num_blocks
