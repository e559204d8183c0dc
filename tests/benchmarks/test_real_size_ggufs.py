"""benchmarks/real_size_ggufs.py's MXFP4 quantizer (llama.cpp's bytes) and its gpt-oss shape in the
MXFP4_MOE mix, as zeroserve's GGUF reader sees a file of it."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from benchmarks.real_size_ggufs import Shape, mxfp4_moe, quantize_mxfp4, write
from engine_proc.loader import load_gguf
from proto.gguf_header import read_gguf_header

# NOTE: gpt-oss-20b's layer at a sixteenth of its widths (two layers, one sliding).
TINY_GPT_OSS = Shape(
    192, 2, 192, 4, 2, 48, is_tied=False, has_qkv_bias=True, architecture="gpt-oss", rope_theta=150000.0,
    num_experts=4, num_experts_per_tok=2, expert_intermediate_size=96, sliding_window=128, yarn=(32.0, 4096),
)


def test_mxfp4_blocks_are_the_bytes_of_llama_cpps_reference_quantizer() -> None:
    values = np.random.default_rng(0).normal(0, 0.02, (64, 256)).astype(np.float32)
    values[0, :32] = 0  # NOTE: a block of zeros: exponent byte 0
    values[1, :32] = np.arange(32) / 4 - 4  # NOTE: ties between e2m1 values: the smaller magnitude
    values[2] *= 1000
    expected = np.asarray(gguf.quants.quantize(values, gguf.GGMLQuantizationType.MXFP4))
    assert np.array_equal(quantize_mxfp4(values, rows_at_once=5), expected)


def test_a_gpt_oss_file_in_mxfp4_moe_reads_as_gpt_oss(tmp_path: Path) -> None:
    path = tmp_path / "gpt-oss-mxfp4_moe.gguf"
    write(TINY_GPT_OSS, "Q8_0", path, types=mxfp4_moe)
    types = {info.name: gguf.GGMLQuantizationType(info.ggml_type).name for info in read_gguf_header(path).tensors}
    assert {name for name, kind in types.items() if kind == "MXFP4"} == {
        f"blk.{layer}.ffn_{kind}_exps.weight" for layer in range(2) for kind in ("gate", "up", "down")
    }
    floats = ("blk.1.attn_sinks.weight", "blk.1.ffn_down_exps.bias", "blk.1.ffn_gate_inp.weight", "blk.1.attn_q.bias")
    assert {types[name] for name in floats} == {"F32"}
    assert types["token_embd.weight"] == types["output.weight"] == types["blk.0.attn_output.weight"] == "Q8_0"
    config, weights = load_gguf(path)
    assert (config.architecture, config.sliding_window, config.sliding_layers) == ("gpt_oss", 128, (True, False))
    assert dict(config.rope_scaling or ())["factor"] == 32.0 and config.attention_bias
    assert (config.num_experts, config.num_experts_per_tok, config.expert_intermediate_size) == (4, 2, 96)
    gpt_oss_names = ("self_attn.sinks", "self_attn.o_proj.bias", "mlp.gate.bias", "mlp.experts.3.down_proj.bias")
    assert {f"model.layers.1.{name}" for name in gpt_oss_names} <= weights.names()
