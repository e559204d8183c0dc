"""Chooses, at load, the form each of a model's matmuls runs in for each batch size on this machine."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence

from engine_proc.cpu import matmul_forms
from engine_proc.cpu.matmul_forms import (
    MEASURED_TOKENS,
    MatmulForms,
    Plan,
    describe_plan,
    measure_invariant_plan,
    measure_plan,
)
from engine_proc.cpu.policy import MatmulPolicy
from engine_proc.cpu.quantized_linear import Linear
from engine_proc.cpu.saved_plans import saved_plan
from engine_proc.cpu.torch_forms import Int8Rows

logger = logging.getLogger(__name__)

# The output head is timed up to this many rows (a row per sampled sequence): past it, the
# winner at 64 serves, since timing a 49152-wide head at 256 rows would slow every start.
HEAD_MEASURED_ROWS = (1, 4, 16, 64)
# NOTE: a load's timing stops growing past this many seconds, so a slow or emulated CPU starts in
# bounded time (QEMU's Haswell timed the default model's matmuls for 20.6 s): each kind still
# timed gets one size, a kind not yet timed takes the plan of the kind before. A 2-core Zen 4
# times everything in about 2 s.
LOAD_BUDGET_S = 4.0


class TimingBudget:
    """The seconds one load may spend timing matmuls, counted from its first timing (the packing
    before it is not timing)."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = LOAD_BUDGET_S if seconds is None else seconds
        self.deadline = math.inf  # a matmul_forms.clock() reading, once started

    def start(self) -> float:
        if self.deadline == math.inf:
            self.deadline = matmul_forms.clock() + self.seconds
        return self.deadline

    def is_spent(self) -> bool:
        return matmul_forms.clock() > self.deadline


def plan_linears(
    linears: Sequence[tuple[str, Linear]], forms: tuple[str, ...], policy: MatmulPolicy, budget: TimingBudget | None = None,
) -> tuple[str, int]:
    """Builds each projection's forms and, when the `policy` measures, plans them per kind (q/k/v, o,
    gate/up, down): a plan an earlier load of the same shapes here saved, else timed (see
    `measure_plan`; batch-invariant, one row-invariant form for every size where the kind has
    one, see `measure_invariant_plan`), or once the `budget` is spent the kind before's plan.
    Returns the plan in words and how many plans were saved ones."""
    is_invariant, is_measured = policy.is_batch_invariant, policy.is_measured
    groups: dict[str, list[MatmulForms]] = {}
    for name, linear in linears:
        groups.setdefault(name.rpartition(".")[2], []).append(linear.prepack(forms, is_invariant))
    plans = {}
    num_saved = 0
    previous: Plan | None = None
    budget = budget or TimingBudget()
    for kind, group in groups.items():
        if is_measured and len(group[0].runs) > 1:
            plan, is_saved = _saved_timed_or_copied(kind, group, previous, budget, is_invariant)
            num_saved += is_saved
            for matmul in group:
                matmul.set_plan(plan)
            previous = plan
        # NOTE: a file may hold one kind of projection in several types (a Q4_K_M file's down
        # projections in Q4_K and Q6_K): each plan, with how many weights it serves.
        described = Counter(describe_plan(matmul.plan) for matmul in group)
        plans[kind] = ", ".join(plan if len(described) == 1 else f"{plan} ({count})" for plan, count in described.items())
    if is_measured:
        for _, linear in linears:
            linear.drop_unplanned()
    if len(set(plans.values())) == 1:
        return next(iter(plans.values())), num_saved
    return "; ".join(f"{kind}: {plan}" for kind, plan in plans.items()), num_saved


def _saved_timed_or_copied(
    kind: str, group: list[MatmulForms], previous: Plan | None, budget: TimingBudget, is_invariant: bool
) -> tuple[Plan, bool]:
    saved, save = saved_plan(group, MEASURED_TOKENS, is_invariant)
    if saved is not None:
        return saved, True
    if budget.is_spent() and previous is not None and all(form in group[0].runs for _, form in previous):
        # NOTE: not saved: the next load may have the time to measure it.
        logger.info("matmul timing budget (%.0f s) spent: %s takes the plan of the kind before", budget.seconds, kind)
        return previous, False
    plan = measure_invariant_plan(group, deadline=budget.start()) if is_invariant else None
    if plan is None:
        plan = measure_plan(group, preferred="packed", deadline=budget.start())
    save(plan)
    return plan, False


def plan_head(
    head: MatmulForms, forms: tuple[str, ...], int8_rows: Int8Rows | None, policy: MatmulPolicy,
    budget: TimingBudget | None = None,
) -> tuple[str, int]:
    """Builds the output head's forms (int8 rows only if given: they come from float32 weights) and
    plans them: a saved plan, or timed (once the `budget` is spent, at one row count only).
    Without measuring, packed where it packs, else dense (the other forms kept, unused). Batch-invariant,
    a head given a row-invariant form runs it at every row count. Returns the plan in words and whether
    it was a saved one."""
    if (policy.is_batch_invariant or not head.has_dense) and (plan := measure_invariant_plan([head], HEAD_MEASURED_ROWS)) is not None:
        head.set_plan(plan)
        return describe_plan(head.plan), 0
    # NOTE: beside a packed head, its transpose: a narrow head (64 inputs, 49152 outputs, 256 rows) ran 10.9 ms
    # packed against 5.9 ms as a plain matmul of the stored transpose on one core; at 576 inputs packed was ahead.
    head.add_torch_forms(forms, "head", int8_rows=int8_rows)
    is_packed = "packed" in head.runs
    default = "packed" if is_packed else "dense"
    is_saved = False
    if policy.is_measured and len(head.runs) > 1:
        plan, save = saved_plan([head], HEAD_MEASURED_ROWS)
        is_saved = plan is not None
        if plan is None:
            # NOTE: dense is preferred only where packed is there; on AVX2 its emulated bfloat16 ran 73 ms
            # at 16 rows against int8's 15, and took every row count past a spent budget.
            plan = measure_plan(
                [head], HEAD_MEASURED_ROWS, preferred="packed" if is_packed else "", deadline=(budget or TimingBudget()).start()
            )
            save(plan)
        head.set_plan(plan)
    else:
        head.plan = ((head.plan[-1][0], default),)
    return describe_plan(head.plan), int(is_saved)
