"""Stand-in matmul timings for load tests: fixed times per form, and a clock that moves only as those
timings say, so no test's outcome depends on how fast this machine happens to be."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from engine_proc.cpu import matmul_forms
from engine_proc.cpu.form_registry import FORMS


class StandInTimer:
    """Times each form as `time_of(form)`, says each timing took `seconds_per_timing` on the budgets'
    clock, and keeps the forms each matmul timing compared."""

    def __init__(self, time_of: Callable[[str], float], seconds_per_timing: float = 0.0) -> None:
        self.time_of = time_of
        self.seconds_per_timing = seconds_per_timing
        self.now = 0.0
        self.timed: list[set[str]] = []

    def clock(self) -> float:
        return self.now

    def median_times(self, runs: dict[str, object], repeats: int = 0, budget_s: float = 0.0) -> dict[str, float]:
        self.now += self.seconds_per_timing
        # NOTE: only matmul forms count: on an AMX CPU the greedy head also compares itself with
        # the plain head ("candidate" against "baseline"), at every load, saved plans or not.
        if set(runs) <= set(FORMS):
            self.timed.append(set(runs))
        return {name: self.time_of(name) for name in runs}


def stand_in_timer(
    monkeypatch: pytest.MonkeyPatch, time_of: Callable[[str], float], seconds_per_timing: float = 0.0
) -> StandInTimer:
    """Puts a `StandInTimer` in place of the matmul timer and its clock for the rest of the test."""
    timer = StandInTimer(time_of, seconds_per_timing)
    monkeypatch.setattr(matmul_forms, "median_times", timer.median_times)
    monkeypatch.setattr(matmul_forms, "clock", timer.clock)
    return timer
