"""Chooses, at load, the form each of a model's matmuls runs in for each batch size on this machine."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import partial

from engine_proc.models.matmul_forms import MEASURED_TOKENS, Int8Rows, MatmulForms, describe_plan, measure_plan
from engine_proc.models.quantized_linear import Linear
from engine_proc.models.saved_plans import saved_or_measured

logger = logging.getLogger(__name__)

# The output head is timed up to this many rows (a row per sampled sequence): past it, the
# winner at 64 serves, since timing a 49152-wide head at 256 rows would slow every start.
HEAD_MEASURED_ROWS = (1, 4, 16, 64)


def plan_linears(linears: Sequence[tuple[str, Linear]], forms: tuple[str, ...], is_measured: bool) -> tuple[str, int]:
    """Builds each projection's forms and, when `is_measured`, times them per kind (q/k/v, o,
    gate/up, down: see `measure_plan`; a plan saved by an earlier load of the same shapes here is
    reused) to plan them all; returns the plan in words and how many plans were reused."""
    groups: dict[str, list[MatmulForms]] = {}
    for name, linear in linears:
        groups.setdefault(name.rpartition(".")[2], []).append(linear.prepack(forms))
    plans = {}
    num_saved = 0
    for kind, group in groups.items():
        if is_measured and len(group[0].runs) > 1:
            plan, is_saved = saved_or_measured(group, MEASURED_TOKENS, partial(measure_plan, group, preferred="packed"))
            num_saved += is_saved
            for matmul in group:
                matmul.set_plan(plan)
        plans[kind] = describe_plan(group[0].plan)
    if len(set(plans.values())) == 1:
        return next(iter(plans.values())), num_saved
    return "; ".join(f"{kind}: {plan}" for kind, plan in plans.items()), num_saved


def plan_head(
    head: MatmulForms, forms: tuple[str, ...], int8_rows: Int8Rows | None, is_measured: bool
) -> tuple[str, int]:
    """Builds the output head's forms (int8 rows only if given: they come from float32 weights) and
    plans them (or reuses a saved plan); without measuring, packed where it packs, else dense (the
    other forms kept, unused). Returns the plan in words and whether it was a saved one."""
    is_packed = "packed" in forms and head.add_packed()
    if is_packed:
        # NOTE: a narrow head (64 inputs, 49152 outputs, 256 rows) ran 10.9 ms packed against 5.9 ms
        # as a plain matmul of the stored transpose on one core; at 576 inputs packed was ahead.
        head.add_transposed()
    elif "float32" in forms and head.weight.dtype.itemsize < 4:
        head.add_float32()
    if int8_rows is not None and "int8" in forms:
        head.add_int8(int8_rows)
    default = "packed" if is_packed else "dense"
    is_saved = False
    if is_measured and len(head.runs) > 1:
        plan, is_saved = saved_or_measured(
            [head], HEAD_MEASURED_ROWS, partial(measure_plan, [head], HEAD_MEASURED_ROWS, preferred=default)
        )
        head.set_plan(plan)
    else:
        head.plan = ((head.plan[-1][0], default),)
    return describe_plan(head.plan), int(is_saved)
