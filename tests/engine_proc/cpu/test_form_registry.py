"""The form registry: every form has a fidelity bound, every form of ours a trial call that runs at
load (and keeps every kernel off when it fails), and only our kernels claim row invariance."""

from __future__ import annotations

import dataclasses

import pytest

from engine_proc.cpu import kernels as cpu_kernels
from engine_proc.cpu.features import cpu_features
from engine_proc.cpu.form_registry import FORMS, KERNEL_FORMS, Fidelity

needs_kernels = pytest.mark.skipif(
    cpu_kernels.load_cpu_kernels() is None,
    reason=f"zeroserve's kernel forms need x86 with AVX2 or AVX-512 BF16 and VNNI, and g++ ({cpu_features().describe()})",
)


def test_every_form_has_a_fidelity_bound_and_only_kernel_forms_claim_row_invariance() -> None:
    for spec in FORMS.values():
        assert isinstance(spec.fidelity, Fidelity) and spec.fidelity.max_rank >= 1 and spec.fidelity.near_tie_nats >= 0
        # NOTE: `parts` runs kernel forms side by side, and is row-invariant as they are.
        assert spec.is_row_invariant == (spec.kernel is not None or spec.name == "parts"), spec.name
        assert spec.source in (
            "weight", "q4 blocks", "q5 blocks", "q8 blocks", "q4k blocks", "q5k blocks", "q6k blocks", "iq4xs blocks",
            "mxfp4 blocks", "blocks of several kinds",
        ), spec.name
    assert {spec.name for spec in KERNEL_FORMS} == {
        "int4_q8", "int4k_q8", "int5_q8", "int5k_q8", "int6k_q8", "iq4xs_q8", "mxfp4_q8", "int8_q8",
    }


@needs_kernels
@pytest.mark.parametrize("spec", KERNEL_FORMS, ids=[spec.name for spec in KERNEL_FORMS])
def test_every_kernel_form_has_a_trial_call_that_holds_here(spec: object) -> None:
    assert dataclasses.is_dataclass(spec)
    kernel = spec.kernel  # type: ignore[attr-defined]
    assert kernel is not None and kernel.trial(cpu_kernels.load_cpu_kernels())


@needs_kernels
def test_a_kernel_form_whose_trial_fails_keeps_every_kernel_off(monkeypatch: pytest.MonkeyPatch) -> None:
    failing = dataclasses.replace(KERNEL_FORMS[-1], kernel=dataclasses.replace(KERNEL_FORMS[-1].kernel, trial=lambda kernels: False))
    monkeypatch.setattr(cpu_kernels, "KERNEL_FORMS", (*KERNEL_FORMS[:-1], failing))
    assert cpu_kernels.load_cpu_kernels.__wrapped__() is None
