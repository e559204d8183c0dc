"""The forms one weight can be multiplied by on this machine, and which form serves how many tokens.

A weight [out, in] is kept as loaded ("dense", the model's dtype) and, where they run here, as:

- "int4": the GGUF's own 4-bit group-32 blocks (`aten._weight_int4pack_mm_for_cpu`);
- "int4_q8": the same blocks times the activations rounded to 8 bits per group of 32 (a scale per
  row and group, as llama.cpp multiplies a GGUF's 4-bit blocks), integer products by AVX-512 VNNI
  or AVX2 (csrc/int4_q8.cpp): on a Zen 2, a Zen 4 and with torch held to AVX2 the fastest form at
  every size, at the cost of more drift than the others (tests/engine_proc/test_fidelity_int4.py
  states and bounds it);
- "int8": int8 rows with one scale per row (`aten._weight_int8pack_mm`), only for weights that
  came quantized (a 4-bit GGUF): the rounding of an 8-bit row is far below the file's 4-bit one;
- "packed": oneDNN's blocked bfloat16 layout (bit for bit the dense result), where oneDNN has
  native bfloat16 (AVX-512 BW/VL/DQ, AVX-NE-CONVERT or AMX; it refuses elsewhere);
- "float32": a float32 copy, for CPUs where bfloat16 matmuls are emulated (AVX2): activations
  are widened, multiplied by MKL/oneDNN's float32 GEMM and rounded back;
- "transposed": [in, out] for `x @ w` (output heads with a narrow input, where oneDNN's layout
  loses at many rows).

- "int8_q8": 8-bit blocks of 32 (GGUF's Q8_0; an output head's float weight is rounded to them)
  times the activations rounded to 8 bits per group of 32, integer products (csrc/int8_q8.cpp),
  as llama.cpp multiplies a Q8_0 tensor.

torch's forms are made by torch_forms, and form_registry's entry of each says which weights get it.

Which is fastest depends on the CPU and the batch (for the default model's projections, of
torch's forms: on a Zen 2 int4 at 1 token, int8 at 16 and 64; on Zen 4 and AMX int4 at few tokens,
packed bfloat16 above; with the C++ kernels on a Zen 4, int4_q8 at every size), so `measure_plan` times the candidates at load and the plan maps a number of
tokens to the fastest form.

Speed must not change the answer: a batch-invariant plan (the engine's default) runs one
row-invariant form at every batch size, so a row's result never depends on the rows beside it.
A form is row-invariant when each row's arithmetic is the same, in the same order, whatever
other rows share the call (form_registry says which are; tests/engine_proc/cpu/test_quantized_linear.py
holds each that claims it to bit-identical rows at 1, 3, 16 and 64 rows). torch's and oneDNN's kernels pick their
blocking, and with it the order of a row's sums, by the batch's shape, so none of theirs claims it.
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from engine_proc.cpu.form_registry import FORMS, TORCH_FORMS
from engine_proc.cpu.torch_forms import Int8Rows, TorchFormContext

logger = logging.getLogger(__name__)

Plan = tuple[tuple[int, str], ...]  # (at most this many tokens, form), ascending; the last covers all

# Token counts measured at load, and up to where each one's winner serves (geometric midpoints).
MEASURED_TOKENS = (1, 4, 16, 64, 256)
_SERVES_UP_TO = (2, 8, 32, 128, sys.maxsize)
# NOTE: a candidate this much slower than the best at one size, and not closing in since the size
# before, is not timed at larger ones (bfloat16 emulated on AVX2 is 9x float32 at 64 tokens:
# timing it would slow every start; float32 is far behind int4 at one token, but catches up).
_PRUNE_RATIO = 3.0
_REPEATS = 5
# NOTE: timing is bounded, so a slow CPU (or an emulated one: qemu-user runs a 256-token float32
# projection in seconds) starts in bounded time: a size stops repeating after this long, and
# larger sizes are not timed once a weight's measurements have taken this long (the last
# measured winner, or the preferred form, serves them).
_SIZE_BUDGET_S = 0.4
STREAMED_TOKENS = 4
_NUM_SAMPLED = 3
_WEIGHT_BUDGET_S = 2.0
# NOTE: the clock the timing budgets (a load's, a weight's) read, looked up at each reading: tests
# stand in one that moves only as their stand-in timings say, so no test depends on this machine's
# speed. `median_times` measures the runs themselves with time.perf_counter.
clock: Callable[[], float] = time.perf_counter



class MatmulForms:
    """One weight in the forms kept for it here, and the plan that picks one per batch size."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None, has_dense: bool = True) -> None:
        """`has_dense` False: `weight` holds no values (a weight loaded only as the file's blocks, see
        loader/model_weights.py) and gives its shape, dtype and device alone: no form is made from it."""
        self.weight = weight
        self.bias = bias
        self.has_dense = has_dense
        self.runs: dict[str, Callable[[Tensor], Tensor]] = {"dense": self._dense} if has_dense else {}
        # NOTE: the tensors each of torch's forms made for itself (a kernel form's run holds its own packing).
        self.held: dict[str, tuple[Tensor, ...]] = {}
        self.plan: Plan = ((sys.maxsize, "dense"),)

    def _dense(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def add(self, form: str, run: Callable[[Tensor], Tensor]) -> None:
        self.runs[form] = run

    def add_torch_forms(
        self, asked: tuple[str, ...], role: str, has_int4: bool = False, int8_rows: Int8Rows | None = None
    ) -> None:
        """Adds, in the registry's order, each of torch's forms that its entry's rule gives this weight
        (`role` "projection" or "head"; `asked`: the forms the model asks for on this machine) and that
        can be made here (oneDNN's layout is refused without native bfloat16)."""
        for spec in TORCH_FORMS:
            assert spec.torch_ops is not None
            context = TorchFormContext(role, asked, frozenset(self.runs), self.weight.dtype, has_int4, int8_rows is not None)
            if self.has_dense and spec.torch_ops.is_given(context):
                made = spec.torch_ops.make(self.weight, self.bias, int8_rows)
                if made is not None:
                    self.runs[spec.name], self.held[spec.name] = made

    def __call__(self, x: Tensor) -> Tensor:
        num_tokens = x.shape[0]
        for max_tokens, form in self.plan:
            if num_tokens <= max_tokens:
                return self.runs[form](x)
        raise AssertionError("a plan's last entry covers every batch")

    def set_plan(self, plan: Plan) -> None:
        """Keeps the forms the plan uses (and "dense"), dropping the others' memory."""
        self.plan = plan
        used = {form for _, form in plan} | ({"dense"} if self.has_dense else set())
        self.runs = {form: run for form, run in self.runs.items() if form in used}
        self.held = {form: tensors for form, tensors in self.held.items() if form in used}

    def tensors(self) -> list[Tensor]:
        """The tensors the kept forms hold: the weight's values where kept, torch's forms' copies, the
        kernel forms' packings."""
        held = [self.weight] if self.has_dense else []
        for form, run in self.runs.items():
            held += self.held.get(form, ())
            if hasattr(run, "held_tensors"):
                held += run.held_tensors()
        return held


def measure_plan(
    forms: Sequence[MatmulForms], measured_tokens: Sequence[int] = MEASURED_TOKENS, preferred: str = "",
    deadline: float = math.inf,
) -> Plan:
    """The fastest form at each measured token count, timed over `forms` (weights of one shape, run
    one after another as in a step) and merged into a plan.

    Up to `STREAMED_TOKENS` tokens every weight is run, so they stream from memory as in a step
    (a few layers' weights stay in cache and favour the wider int8 rows: 125 µs a projection in a
    step against 85 for int4, where three cached layers had timed int8 ahead); above, where the
    arithmetic dominates, a few spread over the layers. `preferred` wins unless another form is
    at least 5% faster (fewer switches on noise). Past `deadline` (a `clock()` reading: the
    load's whole timing budget) no further size is timed."""
    sampled = forms[:: max(1, len(forms) // _NUM_SAMPLED)][:_NUM_SAMPLED]
    candidates = [form for form in forms[0].runs if all(form in f.runs for f in forms)]
    if "packed" in candidates and "dense" in candidates:
        candidates.remove("dense")  # NOTE: the same bits, reordered on every call
    in_features, dtype, device = forms[0].weight.shape[1], forms[0].weight.dtype, forms[0].weight.device
    winners: list[str] = []
    previous_behind: dict[str, float] = {}
    started = clock()
    for num_tokens in measured_tokens:
        if winners and ((now := clock()) - started > _WEIGHT_BUDGET_S or now > deadline):
            winners.append(preferred if preferred in candidates else winners[-1])
            continue
        x = torch.randn(num_tokens, in_features, dtype=dtype, device=device)
        timed = forms if num_tokens <= STREAMED_TOKENS else sampled
        times = median_times({form: _run_all(timed, form, x) for form in candidates}, budget_s=_SIZE_BUDGET_S)
        best = min(times, key=times.__getitem__)
        if preferred in times and times[preferred] <= 1.05 * times[best]:
            best = preferred
        winners.append(best)
        behind = {form: times[form] / times[best] for form in candidates}
        candidates = [
            form for form in candidates if behind[form] <= _PRUNE_RATIO or behind[form] < previous_behind.get(form, math.inf)
        ]
        previous_behind = behind
    bounds = list(_SERVES_UP_TO[: len(winners) - 1]) + [sys.maxsize]
    plan: list[tuple[int, str]] = []
    for bound, winner in zip(bounds, winners, strict=True):
        if plan and plan[-1][1] == winner:
            plan[-1] = (bound, winner)
        else:
            plan.append((bound, winner))
    return tuple(plan)


def measure_invariant_plan(
    forms: Sequence[MatmulForms], measured_tokens: Sequence[int] = MEASURED_TOKENS, deadline: float = math.inf
) -> Plan | None:
    """One row-invariant form for every batch size: the one whose time, over the measured token
    counts, is least behind the fastest of them (the geometric mean of its ratios to the best at
    each count); not timed when only one is kept here. None when the weights have none."""
    candidates = [
        form for form in forms[0].runs if FORMS[form].is_row_invariant and all(form in f.runs for f in forms)
    ]
    if len(candidates) <= 1:
        return ((sys.maxsize, candidates[0]),) if candidates else None
    sampled = forms[:: max(1, len(forms) // _NUM_SAMPLED)][:_NUM_SAMPLED]
    in_features, dtype, device = forms[0].weight.shape[1], forms[0].weight.dtype, forms[0].weight.device
    behind = dict.fromkeys(candidates, 0.0)
    started = clock()
    for num_tokens in measured_tokens:
        if num_tokens != measured_tokens[0] and ((now := clock()) - started > _WEIGHT_BUDGET_S or now > deadline):
            break
        x = torch.randn(num_tokens, in_features, dtype=dtype, device=device)
        timed = forms if num_tokens <= STREAMED_TOKENS else sampled
        times = median_times({form: _run_all(timed, form, x) for form in candidates}, budget_s=_SIZE_BUDGET_S)
        best = min(times.values())
        for form in candidates:
            behind[form] += math.log(times[form] / best)
    return ((sys.maxsize, min(candidates, key=behind.__getitem__)),)


def median_times(
    runs: dict[str, Callable[[], object]], repeats: int = _REPEATS, budget_s: float = float("inf")
) -> dict[str, float]:
    """Each run's median time over `repeats`, interleaved so a burst of other load hits them all,
    after one warm-up round (which counts only if `budget_s` ran out before a second round)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    started = time.perf_counter()
    for _ in range(repeats + 1):
        for name, run in runs.items():
            run_started = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - run_started)
        if time.perf_counter() - started > budget_s:
            break
    return {name: statistics.median(values[1:] or values) for name, values in times.items()}


def is_faster(candidate: Callable[[], object], baseline: Callable[[], object], margin: float = 1.0) -> bool:
    """Whether `candidate` runs in less than 1 / `margin` of `baseline`'s time (medians, interleaved)."""
    times = median_times({"candidate": candidate, "baseline": baseline})
    return times["candidate"] * margin < times["baseline"]


def describe_plan(plan: Plan) -> str:
    """"int4 ≤2 tokens, int8 ≤32, float32 above" (or just "packed")."""
    if len(plan) == 1:
        return plan[0][1]
    parts = [f"{form} ≤{bound}" for bound, form in plan[:-1]]
    parts[0] += " tokens"
    return ", ".join(parts) + f", {plan[-1][1]} above"


def _run_all(forms: Sequence[MatmulForms], form: str, x: Tensor) -> Callable[[], None]:
    runs = [f.runs[form] for f in forms]

    def run() -> None:
        for matmul in runs:
            matmul(x)

    return run
