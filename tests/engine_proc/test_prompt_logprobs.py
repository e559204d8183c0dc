"""Prompt logprobs on a tiny random model: chunked prefill gives what one whole prefill gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine_proc.core import EngineCore
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from proto.engine_output import Logprobs

PROMPT = list(range(200, 250))


def prompt_logprobs(core: EngineCore, num_top: int = 2) -> Logprobs:
    params = SamplingParams(temperature=0.0, max_tokens=1, num_prompt_logprobs=num_top, num_logprobs=1)
    core.add_request(EngineCoreRequest("r", PROMPT, params))
    found = None
    while core.has_work:
        for output in core.step().outputs:
            found = found or output.prompt_logprobs
    assert found is not None
    return found


def test_chunked_prefill_matches_the_reference(tiny_model_dir: Path) -> None:
    from transformers import LlamaForCausalLM

    chunked = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05,
                                      max_num_batched_tokens=16))
    result = prompt_logprobs(chunked)
    assert len(result.token_ids) == len(PROMPT) - 1
    assert [ids[0] for ids in result.token_ids] == PROMPT[1:]
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        reference = model(torch.tensor([PROMPT])).logits[0, :-1].log_softmax(dim=-1)
    expected = reference.gather(1, torch.tensor(PROMPT[1:]).unsqueeze(1)).squeeze(1)
    assert [values[0] for values in result.logprobs] == pytest.approx(expected.tolist(), abs=1e-3)
    assert [values[1] for values in result.logprobs] == pytest.approx(reference.max(dim=-1).values.tolist(), abs=1e-3)
    # A second identical request would hit the prefix cache; prompt logprobs must still be whole.
    assert len(prompt_logprobs(chunked).token_ids) == len(PROMPT) - 1
