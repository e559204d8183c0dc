"""What the engine's CPU paths see of the CPU: torch's CPUID reading, lowered by ATEN_CPU_CAPABILITY."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from engine_proc.cpu.features import CpuFeatures, cpu_features

_PRINT_FEATURES = (
    "import json; from engine_proc.cpu.features import cpu_features as f; c = f(); "
    "print(json.dumps([c.capability, c.has_avx2, c.has_avx512_bf16, c.has_amx, c.kernel_isa]))"
)


def features_with(capability: str) -> list[object]:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    out = subprocess.run([sys.executable, "-c", _PRINT_FEATURES], env=env, capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_features_follow_torchs_capability() -> None:
    features = cpu_features()
    assert features.capability == torch.backends.cpu.get_cpu_capability()
    if features.has_avx512_bf16 or features.has_amx:
        assert features.has_avx512
    if not features.is_x86:
        assert features.kernel_isa is None


@pytest.mark.skipif(not cpu_features().has_avx2, reason="needs an x86 CPU with AVX2 to lower from")
def test_a_lowered_capability_turns_the_wider_paths_off() -> None:
    assert features_with("avx2") == ["AVX2", True, False, False, "avx2"]
    assert features_with("default") == ["DEFAULT", False, False, False, None]


def test_kernel_isa_by_cpu_kind() -> None:
    def kind(machine: str, capability: str, bf16: bool = False, vnni: bool = False) -> str | None:
        return CpuFeatures(machine, capability, has_avx512_bf16=bf16, has_avx512_vnni=vnni, has_amx=False).kernel_isa

    assert kind("x86_64", "AVX512", bf16=True, vnni=True) == "avx512_bf16"
    assert kind("x86_64", "AVX512", vnni=True) == "avx2"  # the AVX-512 build needs both
    assert kind("x86_64", "AVX512") == "avx2"  # AVX-512 without BF16 (Skylake-X, Ice Lake) runs the AVX2 build
    assert kind("x86_64", "AVX2") == "avx2"
    assert kind("x86_64", "DEFAULT") is None
    assert kind("aarch64", "DEFAULT") is None and kind("aarch64", "SVE256") is None
