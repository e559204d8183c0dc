"""A load's matmul timing is bounded: once its budget is spent, kinds not yet timed take the plan
of the kind before and the head is timed at one row count (stand-in timings and clock: no CPU's
speed assumed, whatever else the machine is doing)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from engine_proc.cpu import matmul_plan
from engine_proc.cpu.policy import FASTEST
from engine_proc.loader import load_model
from proto import envs
from tests.engine_proc.cpu.stand_in_timer import stand_in_timer
from tests.engine_proc.models.tiny_llama import save_tiny_checkpoint


def test_a_spent_budget_copies_the_plan_before_and_times_the_head_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    save_tiny_checkpoint(tmp_path, "llama")
    model = load_model(tmp_path, dtype=torch.bfloat16)
    model.set_int8_lm_head(model.lm_head_weight.float())
    # Each timing takes longer than the whole load's budget.
    timer = stand_in_timer(
        monkeypatch, lambda form: {"int8": 0.4, "float32": 0.5}.get(form, 1.0), seconds_per_timing=matmul_plan.LOAD_BUDGET_S + 1
    )
    monkeypatch.setenv("ZEROSERVE_PLAN_CACHE", "off")
    envs.read.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="engine_proc.cpu.matmul_plan"):
            model.prepack(FASTEST)
    finally:
        envs.read.cache_clear()
    # One size of the first kind (q/k/v), none of the three kinds after it, one row count of the head.
    assert len(timer.timed) == 2 and "int8" in timer.timed[1]
    assert caplog.text.count(f"matmul timing budget ({matmul_plan.LOAD_BUDGET_S:.0f} s) spent") == 3
    plans = {m.forms.plan for m in model.modules() if isinstance(m, matmul_plan.Linear) and m.forms is not None}
    assert len(plans) == 1 and ";" not in model.choices["linears"]  # every kind runs the first kind's plan
    assert model.head is not None and model.head.plan[0][1] == "int8"
