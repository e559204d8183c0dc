"""What this machine's CPU can run, as torch sees it (CPUID, never /proc/cpuinfo).

`/proc/cpuinfo` describes the host: in a VM, a container or an emulator (qemu-user presenting
a Haswell) it lists instructions the process cannot use. torch reads CPUID and also honours
`ATEN_CPU_CAPABILITY` (a lower capability forced by hand), so every fast path asks here.
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

import torch

# torch's capability names, lowest first, for x86 (aarch64 reports "DEFAULT", "SVE128/256/512").
_X86_ORDER = ("DEFAULT", "AVX2", "AVX512")


@dataclass(frozen=True)
class CpuFeatures:
    """The instruction sets the engine's CPU paths choose between."""

    machine: str  # platform.machine(): "x86_64", "aarch64", ...
    capability: str  # torch.backends.cpu.get_cpu_capability()
    has_avx512_bf16: bool  # AVX-512 with BF16 dot products (Zen 4, Cooper Lake, Sapphire Rapids)
    has_avx512_vnni: bool  # AVX-512 with int8 dot products (every CPU with BF16 has it, and Ice Lake, Cascade Lake)
    has_amx: bool  # AMX tiles (with BF16: Sapphire Rapids and later)

    @property
    def is_x86(self) -> bool:
        return self.machine in ("x86_64", "AMD64")

    @property
    def has_avx2(self) -> bool:
        return self.is_x86 and self.capability in _X86_ORDER[1:]

    @property
    def has_avx512(self) -> bool:
        return self.is_x86 and self.capability == "AVX512"

    @property
    def kernel_isa(self) -> str | None:
        """The instruction set zeroserve's C++ kernels are built for here, or None (torch ops only)."""
        if self.has_avx512 and self.has_avx512_bf16 and self.has_avx512_vnni:
            return "avx512_bf16"
        if self.has_avx2:
            return "avx2"
        return None

    def describe(self) -> str:
        extras = [name for name, has in (("avx512_bf16", self.has_avx512_bf16), ("avx512_vnni", self.has_avx512_vnni), ("amx", self.has_amx)) if has]
        return f"{self.machine} {self.capability}" + (f" ({', '.join(extras)})" if extras else "")


@functools.cache
def cpu_features() -> CpuFeatures:
    """This process's CPU features (read once)."""
    capability = torch.backends.cpu.get_cpu_capability()
    machine = platform.machine()
    is_x86 = machine in ("x86_64", "AMD64")
    # NOTE: the CPUID checks alone would miss a capability lowered by ATEN_CPU_CAPABILITY, which
    # is how a run asks for the plainer paths (and how tests stand in for an older CPU).
    is_avx512 = is_x86 and capability == "AVX512"
    return CpuFeatures(
        machine=machine,
        capability=capability,
        has_avx512_bf16=is_avx512 and torch.cpu._is_avx512_bf16_supported(),
        has_avx512_vnni=is_avx512 and torch.cpu._is_vnni_supported(),
        has_amx=is_avx512 and torch.cpu._is_amx_tile_supported(),
    )


def cpu_model_name() -> str:
    """The CPU's marketing name where Linux gives it (for benchmark records only, never for choices)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("model name", "Model", "Hardware")):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
