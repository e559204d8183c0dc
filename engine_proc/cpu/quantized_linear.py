"""The model's linear layers: each keeps its weight in the forms that run here (see matmul_forms and
form_registry), the GGUF's blocks among them.

torch's CPU int4 kernel computes w = (q − 8)·scale + zero per group of 32, so scale = d and
zero = m + 8·d map a Q4_1 file's blocks (w = q·d + m) onto it without re-quantizing (Q4_0 is the
case m = −8·d). Its scales and zeros are rounded to the activations' dtype (bfloat16), so its results
match the dequantized weights within a tolerance, not bit for bit.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine_proc.cpu.form_registry import FORMS, FUSED_FORMS, KERNEL_FORMS, FormSpec
from engine_proc.cpu.matmul_forms import MatmulForms
from engine_proc.cpu.weight_blocks import GROUP_SIZE, Blocks, BlocksReader, Q4Blocks, cat_blocks

# NOTE: all 120 projections of SmolLM2-135M, weights streamed from memory as in a step, 2
# threads. Intel with AMX: int4 6.0 / 8.0 / 15.4 / 19.8 ms at 1 / 2 / 4 / 6 tokens against
# 18-22 ms for prepacked bfloat16 at any of them; Zen 4: int4 ahead up to 8 tokens (24 vs
# 25 ms). Four keeps int4 where it wins on both.
INT4_MAX_TOKENS = 4


# NOTE: a weight is packed this many rows at a time: a 49,152-row head unpacked whole would be the
# peak of a 1B model's load (its codes as bytes, then their permuted copy: 200 MB).
_ROWS_PER_PACK = 4096


def kernel_form(
    kernels: Any, spec: FormSpec, blocks: Blocks | BlocksReader, bias: Tensor | None = None
) -> KernelRun | None:
    """The run of `spec`, a form of the C++ kernels, on a weight's `blocks` (its outputs padded to a
    multiple of 16 for the kernel, the padding cut from each result); None where the form does not
    take these blocks (another kind, or scales a float16 does not hold, as a GGUF's always are)."""
    ops = spec.kernel
    reader = blocks if isinstance(blocks, BlocksReader) else BlocksReader.of(blocks)
    if ops is None or reader.kind is not ops.blocks:
        return None
    packed = _packed(kernels, spec, reader)
    if packed is None:
        return None
    return KernelRun(spec.name, ops.run(kernels), packed, reader.num_rows, bias)


class KernelRun:
    """A weight's run on one kernel form: its packing, kept where a fused layer (moe.py's experts) can reach it."""

    def __init__(
        self, form: str, run: Callable[..., Tensor], packed: list[Tensor], num_rows: int, bias: Tensor | None
    ) -> None:
        self.form, self.run, self.packed, self.num_rows, self.bias = form, run, packed, num_rows, bias

    def __call__(self, x: Tensor) -> Tensor:
        out = self.run(x.contiguous(), *self.packed)
        out = out[:, : self.num_rows] if out.shape[1] != self.num_rows else out
        return out if self.bias is None else out + self.bias

    def held_tensors(self) -> list[Tensor]:
        return self.packed


class PartsRun:
    """A fused weight's parts of several kinds, each run of one kind on its kernel form, the outputs side by side."""

    def __init__(self, runs: list[KernelRun], bias: Tensor | None) -> None:
        self.runs, self.bias = runs, bias

    def __call__(self, x: Tensor) -> Tensor:
        out = torch.cat([run(x) for run in self.runs], dim=-1)
        return out if self.bias is None else out + self.bias

    def held_tensors(self) -> list[Tensor]:
        return [tensor for run in self.runs for tensor in run.packed]


def fused_projection(kernels: Any, matmul: MatmulForms) -> tuple[Any, int] | None:
    """The kernels' `Projection` of the form a weight's plan runs at one token, and up to how many tokens the
    plan keeps it; None where that form is not a kernel form that C++ layers call (FUSED_FORMS), or pads its
    outputs (the layers' Python path then takes other kernels, e.g. torch's rotary for a padded fused QKV)."""
    max_tokens, form = matmul.plan[0]
    run = matmul.runs[form]
    if isinstance(run, PartsRun):
        runs, bias = run.runs, run.bias
    elif isinstance(run, KernelRun) and run.num_rows % 16 == 0:
        runs, bias = [run], run.bias
    else:
        return None
    if not all(part.form in FUSED_FORMS and (part is run or part.bias is None) for part in runs):
        return None
    forms = [FUSED_FORMS.index(part.form) for part in runs]
    return kernels.Projection(forms, [part.packed for part in runs], [part.num_rows for part in runs], bias), max_tokens


def valueless(weight: Tensor) -> Tensor:
    """A stand-in for a weight that holds no values (a kernel form of the file's blocks serves it): its
    shape, dtype and device over one element's storage, so nothing counts it as memory."""
    return torch.empty((), dtype=weight.dtype, device=weight.device).expand(weight.shape)


def parts_form(kernels: Any, parts: list[Blocks], bias: Tensor | None = None) -> PartsRun | None:
    """The run of the `parts` form on a fused weight's parts (stacked by rows) of different kinds: each
    run of consecutive parts of one kind on the kernel form that takes them, the outputs side by side;
    None where a kind has no kernel form here."""
    runs = []
    for _, group in itertools.groupby(parts, key=type):
        blocks = cat_blocks(list(group))
        run = next((run for spec in KERNEL_FORMS if (run := kernel_form(kernels, spec, blocks)) is not None), None)
        if run is None:
            return None
        runs.append(run)
    return PartsRun(runs, bias)


def _packed(kernels: Any, spec: FormSpec, reader: BlocksReader) -> list[Tensor] | None:
    """The form's packing of the weight, built `_ROWS_PER_PACK` rows at a time into tensors made once
    (every packing is laid out by blocks of 16 outputs along its first dimension)."""
    assert spec.kernel is not None
    packed: list[Tensor] = []
    num_padded = reader.num_rows + -reader.num_rows % 16
    for start in range(0, reader.num_rows, _ROWS_PER_PACK):
        part = reader.read(slice(start, min(start + _ROWS_PER_PACK, reader.num_rows)))
        if not all(torch.equal(t.half().float(), t) for t in part[1:] if t.is_floating_point()):
            return None
        padding = -part.codes.shape[0] % 16
        if padding:
            part = type(part)(*(F.pad(t, (0, 0, 0, padding)) for t in part))
        pieces = spec.kernel.pack(kernels, part)
        if not packed:
            packed = [torch.empty((num_padded // 16, *piece.shape[1:]), dtype=piece.dtype) for piece in pieces]
        for whole, piece in zip(packed, pieces, strict=True):
            whole[start // 16 : start // 16 + piece.shape[0]] = piece
    return packed


def is_int4_supported(dtype: torch.dtype, device: torch.device) -> bool:
    """The CPU int4 kernel is fast with 16-bit activations only (its float32 path is a slow reference)."""
    return device.type == "cpu" and dtype == torch.bfloat16


class Linear(nn.Linear):
    """A linear layer that runs each batch in the fastest form kept for its weight (see matmul_forms)."""

    int4_weight: Tensor | None
    int4_scales_and_zeros: Tensor | None

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("int4_weight", None, persistent=False)
        self.register_buffer("int4_scales_and_zeros", None, persistent=False)
        # NOTE: not buffers: oneDNN's layout cannot move devices; `unpack()` drops them.
        self.forms: MatmulForms | None = None
        # NOTE: the file's blocks as loaded, kept from `set_blocks` until the first `prepack` gives them
        # the CPU kernels' layouts (`kernels`: see LlamaForCausalLM.prepack), kept until `unpack`.
        self.blocks: Blocks | None = None
        self.kernel_runs: dict[str, Callable[[Tensor], Tensor]] = {}
        self.kernels: Any | None = None
        # NOTE: False where the weight was loaded as the file's blocks alone, for a kernel form: then
        # `self.weight` holds no values, only its shape, and no other form is made.
        self.has_dense = True

    def prepack(self, forms: tuple[str, ...] = ("packed",), is_invariant: bool = False) -> MatmulForms:
        """Builds the named forms where they run here (int4 whenever loaded; the kernel forms that take
        this weight's blocks; int8 only beside int4; float32 only where bfloat16 cannot be packed), with
        the plan int4 up to INT4_MAX_TOKENS, then packed where there, else dense (`measure_plan` may
        replace it). With `is_invariant`, a weight that has a row-invariant form gets only those (the
        plan runs one)."""
        matmul = MatmulForms(self.weight, self.bias, self.has_dense)
        if self.int4_weight is not None:
            matmul.add("int4", self._int4)
        for spec in KERNEL_FORMS:
            if spec.name in forms or not self.has_dense:
                self._add_kernel_form(matmul, spec)
        if "parts" in self.kernel_runs:
            matmul.add("parts", self.kernel_runs["parts"])
        self.blocks = None
        self.forms = matmul
        if not self.has_dense or (is_invariant and any(FORMS[form].is_row_invariant for form in matmul.runs)):
            if not matmul.runs:
                raise RuntimeError("a weight loaded as blocks alone has lost its kernel forms")
            matmul.plan = ((sys.maxsize, next(form for form in matmul.runs if FORMS[form].is_row_invariant)),)
            return matmul
        matmul.add_torch_forms(forms, "projection", has_int4=self.int4_weight is not None)
        large = "packed" if "packed" in matmul.runs else "dense"
        matmul.plan = ((INT4_MAX_TOKENS, "int4"), (sys.maxsize, large)) if "int4" in matmul.runs else ((sys.maxsize, large),)
        return matmul

    def drop_unplanned(self) -> None:
        """Frees the kernels' packings that this weight's plan does not use."""
        if self.forms is not None:
            self.kernel_runs = {form: run for form, run in self.kernel_runs.items() if form in self.forms.runs}

    def unpack(self) -> None:
        self.forms = None
        self.kernel_runs = {}

    def _add_kernel_form(self, matmul: MatmulForms, spec: FormSpec) -> None:
        """A form of the C++ kernels, where they run and take this weight's blocks (kept for a later prepack)."""
        if spec.name not in self.kernel_runs and self.blocks is not None and self.kernels is not None:
            run = kernel_form(self.kernels, spec, self.blocks, self.bias)
            if run is not None:
                self.kernel_runs[spec.name] = run
        if spec.name in self.kernel_runs:
            matmul.add(spec.name, self.kernel_runs[spec.name])

    def set_parts(self, run: Callable[[Tensor], Tensor]) -> None:
        """Runs the weight as `parts_form`'s `run` alone (the file's parts of several kinds, packed: no values kept)."""
        self.kernel_runs["parts"] = run
        self.has_dense = False
        self.weight.data = valueless(self.weight)

    def set_blocks(self, blocks: Blocks, dtype: torch.dtype, has_dense: bool = True) -> None:
        """Keeps the file's blocks for the kernel forms; with `has_dense` they are the same weight as
        `self.weight` and 4-bit ones are also packed for torch's int4 kernel, else they are the weight's
        only values (see `has_dense`)."""
        if blocks.codes.shape != self.weight.shape or self.in_features % GROUP_SIZE:
            raise ValueError(f"blocks of shape {tuple(blocks.codes.shape)} for a {tuple(self.weight.shape)} weight")
        self.blocks = blocks
        self.has_dense = has_dense
        if not has_dense:
            self.weight.data = valueless(self.weight)
            return
        if not isinstance(blocks, Q4Blocks):
            return
        device = self.weight.device
        self.int4_weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            blocks.codes.to(device=device, dtype=torch.int32), 1
        )
        zeros = blocks.mins + 8 * blocks.scales
        # NOTE: the kernel wants [cols // 32, rows, 2] pairs of (scale, zero).
        self.int4_scales_and_zeros = (
            torch.stack((blocks.scales, zeros), dim=-1).transpose(0, 1).contiguous().to(device=device, dtype=dtype)
        )

    def _int4(self, x: Tensor) -> Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.int4_weight, GROUP_SIZE, self.int4_scales_and_zeros)
        return out if self.bias is None else out + self.bias

    def forward(self, x: Tensor) -> Tensor:
        if self.forms is not None:
            return self.forms(x)
        if self.int4_weight is not None and x.shape[0] <= INT4_MAX_TOKENS:
            return self._int4(x)
        return F.linear(x, self.weight, self.bias)
