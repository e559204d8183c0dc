"""zeroserve's C++ kernels for x86 CPUs (AVX-512 BF16 or AVX2 + FMA): paged attention that reads the
cache in place (decodes, and prompts in chunks), fused RMSNorm (alone or after the residual add), SiLU·up,
and rotary with the K/V cache write for bfloat16 activations, the matmul forms of form_registry (bfloat16
rows rounded to 8 bits per group of 32 times a GGUF's blocks as the file holds them: Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS and MXFP4; integer products by AVX-512 VNNI or AVX2), a mixture-of-experts
layer's experts in one call (`MoeExperts`), a dense decoder's layers in one call for a step of decodes
(`DecoderLayers`), each row's greedy pick (`argmax_rows`), and (AVX-512 build, run only with AMX) greedy
picks straight from the output head.

The same sources build for either instruction set (csrc/vec16.h holds the one part that
differs). Built once per machine and instruction set with torch's extension builder (g++ and
ninja) into torch's extension cache, at `make install` or on the first engine start; where they
cannot be (ARM, an x86 CPU without AVX2, no compiler, `ZEROSERVE_CPU_KERNELS=0`) the engine runs
the same layers as torch ops.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import sys
from pathlib import Path
from typing import Any

from engine_proc.cpu.features import cpu_features
from engine_proc.cpu.form_registry import KERNEL_FORMS
from proto import envs

logger = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_SOURCES = [
    _CSRC / name
    for name in (
        "bindings.cpp", "paged_decode_attention.cpp", "elementwise.cpp", "int4_q8.cpp", "int6k_q8.cpp", "int8_q8.cpp",
        "mxfp4_q8.cpp", "moe_experts.cpp", "decoder_layers.cpp",
    )
]
_HEADERS = [
    _CSRC / name
    for name in ("vec16.h", "q8_rows.h", "nibble_layout.h", "kernel_forms.h", "moe_experts.h", "decoder_layers.h")
]
# NOTE: explicit instruction sets rather than -march=native, and one build per instruction set
# (its name says which), so a build cached on one machine never runs on a CPU that lacks them.
# AMX code is compiled in but runs only where `has_amx` says the CPU has it.
_CFLAGS_BY_ISA = {
    "avx512_bf16": [
        "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mavx512vnni", "-mfma", "-mamx-tile", "-mamx-bf16", "-DZEROSERVE_AMX",
    ],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
}
# NOTE: no contraction of a multiply and an add into one FMA where the source has two operations:
# the compiler's choice would differ between the AVX-512 and AVX2 bodies, and so would their bits.
_BASE_CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off"]
_EXTRA_SOURCES_BY_ISA = {"avx512_bf16": [_CSRC / "greedy_head.cpp"], "avx2": []}


def _build_folder(name: str, sources: list[Path], cflags: list[str]) -> Path:
    """The folder of this build in torch's extension cache, named by everything the binary
    depends on (torch's version, the sources' contents, the flags): every checkout and every
    environment with the same torch shares one build, and two different ones never replace
    each other's."""
    folder = build_root() / f"{name}_{_build_digest(sources, cflags)}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _build_digest(sources: list[Path], cflags: list[str]) -> str:
    """A digest of everything a build's binary depends on: torch's version, Python's, the flags, the sources."""
    import torch

    key = hashlib.sha256()
    for part in (torch.__version__, torch.version.git_version, sys.version, *cflags):
        key.update(part.encode() + b"\0")
    for path in sources:
        key.update(path.name.encode() + b"\0" + path.read_bytes())
    return key.hexdigest()[:16]


@functools.cache
def kernels_digest() -> str:
    """The digest of the kernels this process runs (its build's), or "none": what a saved matmul plan was
    timed with, so a plan outlives no change to the kernels."""
    if load_cpu_kernels() is None:
        return "none"
    isa = cpu_features().kernel_isa
    sources = [*_SOURCES, *_EXTRA_SOURCES_BY_ISA[isa], *_HEADERS]
    return _build_digest(sources, [*_BASE_CFLAGS, *_CFLAGS_BY_ISA[isa]])


def build_root() -> Path:
    """Where torch keeps the extensions it builds (TORCH_EXTENSIONS_DIR, else
    ~/.cache/torch_extensions/py311_cpu): the kernels' builds live there too."""
    from torch.utils import cpp_extension

    return Path(cpp_extension._get_build_directory(".", verbose=False)).resolve()


def _build_or_import(name: str, isa: str) -> Any:
    """Imports the build made for these sources and flags, building it first where there is none."""
    return build_or_import(name, [*_SOURCES, *_EXTRA_SOURCES_BY_ISA[isa]], _CFLAGS_BY_ISA[isa])


def build_or_import(name: str, sources: list[Path], cflags: list[str], headers: tuple[Path, ...] = ()) -> Any:
    """The module of these sources built with these flags (and `headers` beside the kernels' own), from
    torch's extension cache where it was built before."""
    from torch.utils import cpp_extension

    cflags = [*_BASE_CFLAGS, *cflags]
    folder = _build_folder(name, [*sources, *_HEADERS, *headers], cflags)
    is_built = folder / "built"
    if is_built.exists():
        # NOTE: straight from the built library, not through ninja: ninja would rebuild for
        # nothing more than torch's include path seen through another path (another venv, a link).
        return cpp_extension._import_module_from_library(name, str(folder), True)
    kernels = cpp_extension.load(
        name=name, sources=[str(path) for path in sources], extra_cflags=cflags,
        extra_ldflags=["-fopenmp"], build_directory=str(folder), verbose=False,
    )
    is_built.touch()
    return kernels


@functools.cache
def load_cpu_kernels() -> Any | None:
    """The built module (`paged_decode_attention`, `rms_norm`, `add_rms_norm`, `silu_and_mul`, `rotary_store_kv`,
    `router_logits`, `argmax_rows`, each kernel form's pack and run (`pack_int4_q8`, `int4_q8`, ...), the
    `MoeExperts` and `DecoderLayers` classes (with `DecoderLayer` and `Projection`), and in the AVX-512 build
    `pack_greedy_head` and `greedy_head`, run only where `has_amx`), or None where unavailable."""
    if not envs.cpu_kernels():
        return None
    features = cpu_features()
    isa = features.kernel_isa
    if isa not in _CFLAGS_BY_ISA:
        logger.info("CPU kernels: not used (none built for %s; torch ops instead)", features.describe())
        return None
    try:
        import torch

        kernels = _build_or_import(f"zeroserve_cpu_kernels_{isa}", isa)
    except Exception as exc:  # noqa: BLE001 - any build failure leaves the torch ops
        logger.warning("CPU kernels: not used (the C++ build failed: %s)", exc)
        return None
    # NOTE: a kernel that cannot run right here must not fail a step later: one small call each.
    x = torch.linspace(-3, 3, 2 * 64).view(2, 64).bfloat16()
    try:
        is_right = torch.equal(kernels.silu_and_mul(x), (torch.nn.functional.silu(x[:, :32]) * x[:, 32:]))
        is_right &= bool((kernels.rms_norm(x, torch.ones(64).bfloat16(), 1e-5).float() - _rms_norm(x)).abs().max() < 0.05)
        residual = x.flip(0)
        added = x + residual
        normed = kernels.add_rms_norm(x, residual, torch.ones(64).bfloat16(), 1e-5)
        is_right &= torch.equal(residual, added) and bool((normed.float() - _rms_norm(added)).abs().max() < 0.05)
        # one token with one query and one KV head of 32 dims
        cache = torch.zeros(2, 1, 4, 32, dtype=torch.bfloat16)
        qkv = torch.cat((x[0], x[1, :32])).view(1, 96)
        table = torch.ones(1, 64, dtype=torch.bfloat16)  # cos 1, sin 1: x + roll(x)
        query, key = kernels.rotary_store_kv(qkv, table, torch.tensor([2]), cache, 1)
        is_right &= torch.equal(query[0, 0], qkv[0, :32] + qkv[0, :32].roll(16)) and torch.equal(cache[0, 0, 2], key[0, 0])
        is_right &= torch.equal(cache[1, 0, 2], qkv[0, 64:])
        is_right &= all(spec.kernel.trial(kernels) for spec in KERNEL_FORMS if spec.kernel is not None)
    except RuntimeError as exc:
        logger.warning("CPU kernels: not used (a trial call failed: %s)", exc)
        return None
    if not is_right:
        logger.warning("CPU kernels: not used (a trial call disagreed with torch)")
        return None
    logger.info("CPU kernels: built for %s", isa)
    return kernels


def _rms_norm(x: Any) -> Any:
    x = x.float()
    return x * (x.pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt()


def has_amx() -> bool:
    """Whether this CPU has AMX tiles with bfloat16 (the greedy output head's kernel needs them)."""
    return cpu_features().has_amx
