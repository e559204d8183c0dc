"""The engine's memory figures: its peak resident memory, and the bytes its tensors hold."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine_proc import memory_report
from engine_proc.cpu.quantized_linear import valueless
from engine_proc.cpu.torch_forms import PackedWeight
from engine_proc.memory_report import peak_memory_bytes, tensor_bytes

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads Linux's /proc")
# NOTE: the kernel sums its resident-page counters lazily: two readings may differ by a few pages per CPU.
SLACK_BYTES = 2**20


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_the_peak_covers_a_large_tensor_on_top_of_what_was_resident() -> None:
    resident_before = resident_bytes()
    tensor = torch.ones(50 * 2**20)  # NOTE: 200 MiB, every page written
    assert peak_memory_bytes("cpu") >= resident_before + tensor.nbytes - SLACK_BYTES
    assert peak_memory_bytes("cpu") >= resident_bytes() - SLACK_BYTES


def test_without_proc_the_peak_comes_from_getrusage_in_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    tensor = torch.ones(50 * 2**20)
    resident = resident_bytes()
    monkeypatch.setattr(memory_report, "_status_bytes", lambda field: None)
    assert peak_memory_bytes("cpu") >= resident - SLACK_BYTES > tensor.nbytes


def test_tensors_on_the_meta_device_hold_no_bytes() -> None:
    assert tensor_bytes([torch.ones(4), torch.empty(1000, device="meta"), torch.ones(2, dtype=torch.bfloat16)]) == 20


def test_a_storage_counts_once_and_a_stand_in_for_a_weight_as_one_element() -> None:
    weight = torch.ones(1024, 256, dtype=torch.bfloat16)
    assert tensor_bytes([weight, weight.t(), weight[:10], torch.nn.Parameter(weight)]) == weight.nbytes
    assert tensor_bytes([valueless(weight)]) == 2


def test_a_weight_in_onednns_layout_counts_its_bytes() -> None:
    packed = PackedWeight.try_pack(torch.ones(64, 128, dtype=torch.bfloat16))
    if packed is None:
        pytest.skip("oneDNN has no bfloat16 layout on this CPU")
    assert packed.weight.is_mkldnn and tensor_bytes([packed.weight]) == 64 * 128 * 2
