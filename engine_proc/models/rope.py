"""Rotary frequencies and their scalings (linear, llama3, YaRN), computed as transformers' modeling_rope_utils does.

YaRN (gpt-oss, long-context Qwen) keeps the fast-turning dims (more than `beta_fast` turns over the original
context) as they are, divides the slow ones (fewer than `beta_slow` turns) by `factor`, blends the dims
between along a linear ramp, and scales queries and keys by an attention factor (0.1 ln(factor) + 1 unless
given), which the model folds into its cos/sin table.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from engine_proc.models.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> Tensor:
    """Rotary inverse frequencies (float32, [head_dim // 2]), scaled as configured."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    params = config.rope_scaling_params
    if not params:
        return inv_freq
    if params["rope_type"] == "linear":
        return inv_freq / float(params["factor"])
    if params["rope_type"] == "yarn":
        return _yarn(config)
    # NOTE: llama3 scaling, as in transformers' _compute_llama3_parameters: long wavelengths are
    # divided by `factor`, short ones kept, the band between interpolated smoothly.
    factor = float(params["factor"])
    low_freq_factor = float(params["low_freq_factor"])
    high_freq_factor = float(params["high_freq_factor"])
    old_context_len = float(params["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def attention_factor(config: ModelConfig) -> float:
    """What YaRN multiplies cos and sin by (so each query-key product by its square); 1 for the other scalings."""
    params = config.rope_scaling_params
    if params.get("rope_type") != "yarn":
        return 1.0
    if "attention_factor" in params:
        return float(params["attention_factor"])
    factor = _yarn_factor(config)
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, float(mscale)) / yarn_mscale(factor, float(mscale_all_dim))
    return yarn_mscale(factor)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor for `factor` (its paper's 0.1 ln(factor) + 1, with `mscale` on the log)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_factor(config: ModelConfig) -> float:
    params = config.rope_scaling_params
    if "factor" in params:
        return float(params["factor"])
    return config.max_position_embeddings / float(params["original_max_position_embeddings"])


def _yarn(config: ModelConfig) -> Tensor:
    """transformers' _compute_yarn_parameters' inverse frequencies."""
    params = config.rope_scaling_params
    dim, base = config.head_dim, config.rope_theta
    original = float(params["original_max_position_embeddings"])
    beta_fast, beta_slow = float(params.get("beta_fast") or 32), float(params.get("beta_slow") or 1)

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # NOTE: as transformers, against a division by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    interpolated = 1.0 / (_yarn_factor(config) * pos_freqs)
    return interpolated * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
