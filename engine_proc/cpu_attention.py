"""Decode attention that reads the paged bfloat16 K/V cache in place: a C++ kernel for x86 CPUs with AVX-512 BF16.

Built once per machine with torch's extension builder (g++ and ninja) into torch's extension
cache, at `make install` or on the first engine start; where it cannot be (another CPU, no
compiler, `ZEROSERVE_CPU_KERNELS=0`) the engine gathers the blocks and calls SDPA instead.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_SOURCE = Path(__file__).parent / "csrc" / "paged_decode_attention.cpp"
_REQUIRED_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16", "fma")
# NOTE: explicit instruction sets rather than -march=native, so a build cached on one machine
# never runs code another CPU of the kind checked above lacks.
_CFLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma"]

DecodeKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]


@functools.cache
def load_decode_kernel() -> DecodeKernel | None:
    """`paged_decode_attention(query, cache, block_table, row_limits, scale)`, or None where it is unavailable."""
    if os.environ.get("ZEROSERVE_CPU_KERNELS", "1") == "0":
        return None
    missing = [flag for flag in _REQUIRED_CPU_FLAGS if flag not in _cpu_flags()]
    if missing:
        logger.info("paged decode attention: gather + SDPA (this CPU lacks %s)", ", ".join(missing))
        return None
    try:
        from torch.utils import cpp_extension

        module = cpp_extension.load(
            name="zeroserve_paged_decode_attention", sources=[str(_SOURCE)],
            extra_cflags=_CFLAGS, extra_ldflags=["-fopenmp"], verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 - any build failure leaves the portable path
        logger.warning("paged decode attention: gather + SDPA (the C++ kernel did not build: %s)", exc)
        return None
    kernel: DecodeKernel = module.paged_decode_attention
    return kernel


def _cpu_flags() -> set[str]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())
