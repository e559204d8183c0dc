"""YaRN's frequencies and attention factor, read from a config.json, as transformers computes them: bit for bit."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine_proc.loader.hf_loader import config_from_hf
from engine_proc.models.rope import attention_factor, inverse_frequencies

# NOTE: openai/gpt-oss-20b's rope (head_dim 64, its context 131,072 from 4,096), its ramp not truncated.
GPT_OSS_ROPE = {
    "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
    "truncate": False, "original_max_position_embeddings": 4096,
}


@pytest.mark.parametrize("change", [
    {},
    {"truncate": True},
    {"beta_fast": 16.0, "beta_slow": 2.0},
    {"attention_factor": 1.25},
    {"mscale": 1.0, "mscale_all_dim": 0.5},
])
def test_yarn_is_transformers(change: dict[str, Any]) -> None:
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    reference = GptOssConfig(num_hidden_layers=2, rope_parameters={**GPT_OSS_ROPE, **change})
    expected_frequencies, expected_factor = ROPE_INIT_FUNCTIONS["yarn"](reference)
    ours = config_from_hf(reference.to_dict(), {})
    assert torch.equal(inverse_frequencies(ours), expected_frequencies)
    assert attention_factor(ours) == expected_factor


def test_truncating_the_ramp_changes_the_frequencies() -> None:
    """What the GGUF's reading must undo for gpt-oss: llama.cpp rounds the ramp's ends out, gpt-oss does not."""
    from transformers import GptOssConfig

    truncated, exact = (
        config_from_hf(GptOssConfig(num_hidden_layers=2, rope_parameters={**GPT_OSS_ROPE, "truncate": t}).to_dict(), {})
        for t in (True, False)
    )
    assert not torch.equal(inverse_frequencies(truncated), inverse_frequencies(exact))
