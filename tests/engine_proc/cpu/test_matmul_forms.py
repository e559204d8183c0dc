"""The load-time plan: the fastest form per batch size, from timings (stand-ins here, so no CPU's
speed ordering is assumed), merged into ranges, with the preferred form kept on near ties; or,
batch-invariant, one row-invariant form for every size."""

from __future__ import annotations

import sys

import pytest
import torch

from engine_proc.cpu import matmul_forms
from engine_proc.cpu.form_registry import is_plan_row_invariant
from engine_proc.cpu.matmul_forms import MatmulForms, describe_plan, measure_invariant_plan, measure_plan


def forms_with(*names: str) -> MatmulForms:
    forms = MatmulForms(torch.zeros(8, 16))
    for name in names:
        forms.add(name, lambda x: x)
    return forms


def with_timings(monkeypatch: pytest.MonkeyPatch, timing: dict[str, dict[int, float]]) -> list[int]:
    """Stands in for the timer: `timing[form][num_tokens]` seconds; returns the sizes timed."""
    timed_sizes: list[int] = []
    sizes = iter(matmul_forms.MEASURED_TOKENS)

    def median_times(runs: dict[str, object], repeats: int = 0, budget_s: float = 0.0) -> dict[str, float]:
        num_tokens = next(sizes)
        timed_sizes.append(num_tokens)
        return {form: timing[form][num_tokens] for form in runs}

    monkeypatch.setattr(matmul_forms, "median_times", median_times)
    monkeypatch.setattr(matmul_forms, "clock", lambda: 0.0)  # NOTE: no budget runs out, however slow the machine
    return timed_sizes


def test_the_fastest_form_serves_each_range_of_batch_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    with_timings(monkeypatch, {
        "int4": {1: 1.0, 4: 2.0, 16: 9.0, 64: 40.0, 256: 160.0},
        "int8": {1: 1.5, 4: 2.5, 16: 6.0, 64: 20.0, 256: 90.0},
        "float32": {1: 5.0, 4: 5.5, 16: 8.0, 64: 22.0, 256: 60.0},
        "dense": {1: 3.0, 4: 9.0, 16: 30.0, 64: 99.0, 256: 999.0},
    })
    plan = measure_plan([forms_with("int4", "int8", "float32")])
    assert plan == ((8, "int4"), (128, "int8"), (sys.maxsize, "float32"))
    assert describe_plan(plan) == "int4 ≤8 tokens, int8 ≤128, float32 above"


def test_a_near_tie_keeps_the_preferred_form_and_packed_stands_for_dense(monkeypatch: pytest.MonkeyPatch) -> None:
    with_timings(monkeypatch, {
        "int4": {1: 1.0, 4: 1.0, 16: 1.03, 64: 9.0, 256: 9.0},
        "packed": {1: 2.0, 4: 1.5, 16: 1.0, 64: 1.0, 256: 1.0},
    })
    assert measure_plan([forms_with("int4", "packed")], preferred="packed") == ((8, "int4"), (sys.maxsize, "packed"))


def test_forms_far_behind_are_not_timed_at_larger_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: dense falls further behind from 1 to 4 tokens; a KeyError if it were timed at 16.
    timing = {"int4": {n: 1.0 for n in matmul_forms.MEASURED_TOKENS}, "dense": {1: 3.5, 4: 8.0}}
    with_timings(monkeypatch, timing)
    assert measure_plan([forms_with("int4")]) == ((sys.maxsize, "int4"),)


def test_a_plan_routes_each_batch_to_its_form() -> None:
    forms = MatmulForms(torch.eye(4))
    forms.add("doubled", lambda x: 2 * x)
    forms.plan = ((2, "doubled"), (sys.maxsize, "dense"))
    assert torch.equal(forms(torch.ones(2, 4)), 2 * torch.ones(2, 4))
    assert torch.equal(forms(torch.ones(3, 4)), torch.ones(3, 4))
    forms.set_plan(((sys.maxsize, "dense"),))
    assert set(forms.runs) == {"dense"}  # the unused form's memory is dropped


def test_timing_stops_enlarging_once_a_weight_used_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    timed_sizes = with_timings(monkeypatch, {"int4": {1: 1.0, 4: 1.0}, "packed": {1: 2.0, 4: 2.0}})
    clock = iter([0.0, 0.1, 5.0, 5.1, 5.2])  # started, then before each size after the first
    monkeypatch.setattr(matmul_forms, "clock", lambda: next(clock))
    plan = measure_plan([forms_with("int4", "packed")], preferred="packed")
    assert timed_sizes == [1, 4]
    assert plan == ((8, "int4"), (sys.maxsize, "packed"))  # the untimed sizes take the preferred form


def test_an_invariant_plan_runs_the_row_invariant_form_least_behind_at_every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE: stand-in timings for two row-invariant forms (the registry's names, whatever their
    # kernels do): int8_q8 wins at one size only; int4_q8 is never far behind and serves every size;
    # packed, faster at 256 but not row-invariant, is not a candidate (a KeyError if it were timed).
    with_timings(monkeypatch, {
        "int8_q8": {1: 1.0, 4: 3.0, 16: 9.0, 64: 40.0, 256: 160.0},
        "int4_q8": {1: 1.1, 4: 2.0, 16: 5.0, 64: 20.0, 256: 80.0},
    })
    plan = measure_invariant_plan([forms_with("int8_q8", "int4_q8", "packed")])
    assert plan == ((sys.maxsize, "int4_q8"),) and is_plan_row_invariant(plan)
    assert measure_invariant_plan([forms_with("packed", "int8")]) is None  # no row-invariant form: no promise
    assert not is_plan_row_invariant(((8, "int4_q8"), (sys.maxsize, "int8_q8")))  # two forms: two arithmetics


def test_a_single_row_invariant_form_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert with_timings(monkeypatch, {}) == [] and measure_invariant_plan([forms_with("int8_q8", "packed")]) == (
        (sys.maxsize, "int8_q8"),
    )
