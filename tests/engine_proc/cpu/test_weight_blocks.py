"""Rounding float weights to blocks at load (`--quantization q8_0 | q4_0`) gives llama.cpp's own blocks."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine_proc.cpu.weight_blocks import Q4Blocks, Q8Blocks


@pytest.mark.parametrize(("kind", "ggml_type"), [(Q8Blocks, gguf.GGMLQuantizationType.Q8_0),
                                                 (Q4Blocks, gguf.GGMLQuantizationType.Q4_0)])
def test_rounding_equals_gguf_py(kind: type[Q8Blocks] | type[Q4Blocks], ggml_type: gguf.GGMLQuantizationType) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 256, generator=generator) * torch.rand(64, 1, generator=generator)
    weight[3, :32] = 0.0  # a group of zeros: scale 0, every code the zero point
    theirs = gguf.quants.dequantize(gguf.quants.quantize(weight.numpy(), ggml_type), ggml_type)
    np.testing.assert_array_equal(kind.quantize(weight).dequantize().numpy(), theirs)
