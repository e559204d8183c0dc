"""Loading a GGUF one tensor at a time: projections as the file's blocks alone (no values kept), the
embedding read from the file a row at a time, the head packed from its blocks; the same logits as a
load that keeps every value, and an engine whose memory follows the file's size, not its float32 one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.real_size_ggufs import Shape, write
from engine_proc.cpu.features import cpu_features
from engine_proc.cpu.form_registry import FORMS
from engine_proc.cpu.kernels import load_cpu_kernels
from engine_proc.cpu.quantized_linear import Linear
from engine_proc.loader import load_gguf, load_model, model_weights
from tests.engine_proc.models.tiny_llama import run

needs_kernels = pytest.mark.skipif(
    load_cpu_kernels() is None,
    reason=f"zeroserve's kernel forms need x86 with AVX2 or AVX-512 BF16 and VNNI, and g++ ({cpu_features().describe()})",
)
SMALL = Shape(256, 2, 512, 4, 2, 64, is_tied=True)


@needs_kernels
@pytest.mark.parametrize(("ggml_type", "form"), [
    ("Q4_0", "int4_q8"), ("Q5_1", "int5_q8"), ("Q8_0", "int8_q8"), ("Q4_K", "int4k_q8"), ("Q5_K", "int5k_q8"),
    ("Q6_K", "int6k_q8"), ("IQ4_XS", "iq4xs_q8"), ("MXFP4", "mxfp4_q8"),
])
def test_projections_loaded_as_blocks_alone_give_the_logits_of_a_load_that_keeps_their_values(
    tmp_path: Path, ggml_type: str, form: str
) -> None:
    path = tmp_path / f"small-{ggml_type}.gguf"
    write(SMALL, ggml_type, path)
    lean = load_model(path, dtype=None, quantization="auto")
    full = load_model(path, dtype=None, quantization="auto", batch_invariant=False)
    projections = [module for module in lean.modules() if isinstance(module, Linear)]
    assert projections and all(not p.has_dense and p.forms is not None and set(p.forms.runs) == {form} for p in projections)
    assert lean.model.embed_rows is not None and not lean.has_dense_head
    assert lean.head is not None and set(lean.head.runs) == {form}  # the tied head from the file's own blocks
    # The other load keeps the values, and runs the same kernel forms when told to.
    for module in full.modules():
        if isinstance(module, Linear):
            assert module.has_dense and module.forms is not None and FORMS[form].name in module.forms.runs
            module.forms.plan = ((sys.maxsize, form),)
    assert full.head is not None
    full.head.add(form, lean.head.runs[form])
    full.head.plan = ((sys.maxsize, form),)
    ids = torch.randint(0, 49152, (40,))
    assert torch.equal(lean.model.embed_rows(ids), full.model.embed_tokens(ids))
    assert torch.equal(run(lean, [ids]), run(full, [ids]))


@needs_kernels
def test_a_load_not_batch_invariant_keeps_the_blocks_alone_where_their_bfloat16_forms_would_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "small-q4_k.gguf"
    write(SMALL, "Q4_K", path)
    roomy = load_model(path, dtype=None, quantization="auto", batch_invariant=False)
    assert all(p.has_dense for p in roomy.modules() if isinstance(p, Linear))
    # NOTE: 1 MiB available: the small model's bfloat16 forms (4 bytes a weight, 13M of them, most the tied head) would not fit.
    monkeypatch.setattr(model_weights, "available_ram_bytes", lambda: 2**20)
    with caplog.at_level(logging.WARNING, logger="engine_proc.loader.model_weights"):
        tight = load_model(path, dtype=None, quantization="auto", batch_invariant=False)
    assert "the file's blocks alone" in caplog.text
    projections = [module for module in tight.modules() if isinstance(module, Linear)]
    assert projections and all(not p.has_dense for p in projections) and not tight.has_dense_head
    lean = load_model(path, dtype=None, quantization="auto")
    ids = torch.randint(0, 49152, (40,))
    assert torch.equal(run(tight, [ids]), run(lean, [ids]))


@needs_kernels
def test_a_type_without_a_kernel_form_of_its_own_runs_as_8_bit_blocks(tmp_path: Path) -> None:
    # NOTE: TQ2_0 (ternary weights, a float16 scale per 256) is rounded to Q8_0 at load, tensor by tensor.
    path = tmp_path / "small-tq2_0.gguf"
    write(SMALL, "TQ2_0", path)
    lean = load_model(path, dtype=None, quantization="auto")
    exact = load_model(path, dtype=torch.float32, quantization="none")
    projections = [module for module in lean.modules() if isinstance(module, Linear)]
    assert all(not p.has_dense and p.forms is not None and set(p.forms.runs) == {"int8_q8"} for p in projections)
    ids = torch.randint(0, 49152, (40,))
    got, expected = run(lean, [ids]), run(exact, [ids])
    # NOTE: 8-bit weights and activations, bfloat16 between: well within the logits' spread.
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()


@needs_kernels
def test_a_fused_projection_of_two_types_keeps_each_part_in_its_own_blocks(tmp_path: Path) -> None:
    # NOTE: as a Q4_K_M file holds about half its layers: queries and keys in Q4_K, values in Q6_K.
    path = tmp_path / "small-q4_k_m.gguf"
    write(SMALL, "Q4_K", path, types={"attn_v": "Q6_K"})
    lean = load_model(path, dtype=None, quantization="auto")
    exact = load_model(path, dtype=torch.float32, quantization="none")
    qkv = [module for name, module in lean.named_modules() if name.endswith("qkv_proj")]
    assert qkv and all(isinstance(p, Linear) and not p.has_dense and p.forms is not None and set(p.forms.runs) == {"parts"} for p in qkv)
    ids = torch.randint(0, 49152, (40,))
    got, expected = run(lean, [ids]), run(exact, [ids])
    assert (got - expected).abs().max() < 0.05 * expected.abs().max()


@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "MXFP4"])
def test_the_files_blocks_hold_the_values_gguf_py_reads(tmp_path: Path, ggml_type: str) -> None:
    path = tmp_path / f"small-{ggml_type}.gguf"
    write(SMALL, ggml_type, path)
    _, weights = load_gguf(path)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "model.embed_tokens.weight"):
        blocks = weights.blocks(name)
        assert blocks is not None and torch.equal(blocks.dequantize(), weights.float(name)), name
        if "q_proj" not in name:  # NOTE: a llama file's Q and K rows are permuted: read whole
            part = weights.blocks(name, slice(16, 48))
            assert part is not None and torch.equal(part.dequantize(), weights.float(name)[16:48]), name


@needs_kernels
def test_an_mxfp4_file_runs_on_its_own_blocks_at_17_bytes_per_32_weights(tmp_path: Path) -> None:
    # NOTE: gpt-oss's experts: doubled to Q8_0's 34 bytes per 32, gpt-oss-20b's would not fit a 24 GB machine.
    path = tmp_path / "small-mxfp4.gguf"
    write(SMALL, "MXFP4", path)
    model = load_model(path, dtype=None, quantization="auto")
    projections = [module for module in model.modules() if isinstance(module, Linear)]
    assert projections and all(p.forms is not None and p.forms.plan == ((sys.maxsize, "mxfp4_q8"),) for p in projections)
    assert model.head is not None and model.head.plan == ((sys.maxsize, "mxfp4_q8"),)
    _, weights = load_gguf(path)
    spec, kernels = FORMS["mxfp4_q8"], load_cpu_kernels()
    assert spec.kernel is not None
    matrices = [name for name in weights.names() if name.endswith(("proj.weight", "embed_tokens.weight"))]
    for name in matrices:
        blocks = weights.blocks(name)
        assert blocks is not None
        packed = spec.kernel.pack(kernels, blocks)
        assert sum(t.nbytes for t in packed) == blocks.codes.numel() * 17 // 32, name


@needs_kernels
def test_an_engine_holds_little_more_than_its_file(tmp_path: Path) -> None:
    # NOTE: about 170M parameters in Q4_0 (a 97 MB file; 690 MB in float32, 345 MB in bfloat16).
    path = tmp_path / "mid-q4_0.gguf"
    write(Shape(1024, 8, 4096, 16, 4, 64, is_tied=True), "Q4_0", path)
    code = (
        "import json\nfrom engine_proc.core import EngineCore\nfrom engine_proc.cpu.kernels import load_cpu_kernels\n"
        "from proto.engine_config import EngineConfig\n"
        "def memory(): return dict(line.split(':', 1) for line in open('/proc/self/status'))\n"
        "load_cpu_kernels()\nbefore = memory()['VmRSS']\n"
        f"core = EngineCore(EngineConfig(model_path={str(path)!r}, kv_cache_memory_gib=0.25, max_model_len=1024))\n"
        "held = {key: int(value.split()[0]) * 1024 for key, value in (('before', before), ('peak', memory()['VmHWM']))}\n"
        "print(json.dumps({**held, 'weights': core.ready_message().weight_bytes}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    memory = json.loads(result.stdout.strip().splitlines()[-1])
    file_bytes, kv_bytes = path.stat().st_size, 2**28
    # NOTE: the bound: the file's size and a third, the KV cache, and 400 MB (torch and the rest);
    # and, closer, what loading added to a process with torch and the kernels in it: a bfloat16 copy of the
    # weights (345 MB) or their float32 values would break it. (The load's temporaries move its peak: 158-200 MB
    # over the same code's runs, so 64 MB over the file's third was too close.)
    assert memory["peak"] <= 1.3 * file_bytes + kv_bytes + 400e6, (memory, file_bytes)
    assert memory["peak"] - memory["before"] <= 1.3 * file_bytes + 128e6, (memory, file_bytes)
    # What the engine reports its weights hold (/v1/models, a multi-model gateway's budget): the kernels'
    # packings of the file's blocks, not the tied head's 49,152-row table in bfloat16 (101 MB) beside them.
    assert 0.8 * file_bytes <= memory["weights"] <= 1.3 * file_bytes, (memory, file_bytes)
