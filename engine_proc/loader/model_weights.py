"""Fills a model built on the meta device with a checkpoint's tensors, one tensor at a time.

A projection whose file holds it as blocks a kernel form multiplies (form_registry), in a
batch-invariant load, is given those blocks alone and packed at once: no float copy of it is ever
made, and its `weight` keeps only its shape. Every other tensor is dequantized (or converted) on
its own and copied into its parameter, so a load never holds the float32 values of the whole file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
from torch import Tensor

from engine_proc.cpu.form_registry import KERNEL_FORMS
from engine_proc.cpu.policy import MatmulPolicy
from engine_proc.cpu.quantized_linear import Linear, kernel_form, parts_form, valueless
from engine_proc.cpu.weight_blocks import Blocks, BlocksReader, Q4Blocks, Q8Blocks, cat_blocks
from engine_proc.models.family import FolderTensor
from engine_proc.models.llama import LlamaForCausalLM, RowEmbedding
from engine_proc.models.registry import family_of, reset_rotary_tables
from proto.kv_cache_budget import available_ram_bytes

logger = logging.getLogger(__name__)

# Hugging Face projections that we store fused, as (fused name, its shards in order).
FUSED_PROJECTIONS = (
    ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("gate_up_proj", ("gate_proj", "up_proj")),
)


class WeightSource(Protocol):
    """A checkpoint's tensors under Hugging Face names, each read when asked for (`rows`: its outermost
    rows only, where the source can read those alone; else all of them)."""

    def names(self) -> set[str]: ...

    def float(self, name: str, rows: slice = slice(None)) -> Tensor: ...

    def blocks(self, name: str) -> Blocks | None: ...

    def blocks_reader(self, name: str) -> BlocksReader | None: ...

    def row_reader(self, name: str) -> Callable[[np.ndarray], Tensor] | None: ...

    def is_quantized(self) -> bool: ...


class TensorDict:
    """Tensors already in memory (a Hugging Face folder's) as a WeightSource; blocks only where a family made some
    of the folder's tensors (gpt-oss's MXFP4 experts), each made when asked for."""

    def __init__(self, tensors: Mapping[str, FolderTensor]) -> None:
        self._tensors = tensors

    def names(self) -> set[str]:
        return set(self._tensors)

    def float(self, name: str, rows: slice = slice(None)) -> Tensor:
        value = self._tensors[name]
        tensor = value if isinstance(value, Tensor) else value().dequantize()
        # NOTE: contiguous, one tensor at a time: a family's split of a folder's tensors gives views (gpt-oss's experts).
        return (tensor[rows] if tensor.dim() > 1 else tensor).contiguous()

    def blocks(self, name: str) -> Blocks | None:
        value = self._tensors[name]
        return None if isinstance(value, Tensor) else value()

    def blocks_reader(self, name: str) -> BlocksReader | None:
        return None

    def row_reader(self, name: str) -> Callable[[np.ndarray], Tensor] | None:
        return None

    def is_quantized(self) -> bool:
        return any(not isinstance(value, Tensor) for value in self._tensors.values())


class RoundedAtLoad:
    """A float checkpoint whose projection weights come as blocks of one kind (Q8_0 or Q4_0), rounded from
    their values when asked for (`--quantization q8_0 | q4_0`): weight-only quantization made at load."""

    def __init__(self, source: WeightSource, kind: type[Q8Blocks] | type[Q4Blocks]) -> None:
        self._source, self._kind = source, kind

    def names(self) -> set[str]:
        return self._source.names()

    def float(self, name: str, rows: slice = slice(None)) -> Tensor:
        return self._source.float(name, rows)

    def blocks(self, name: str) -> Blocks | None:
        if not name.endswith("_proj.weight"):
            return None
        weight = self._source.float(name)
        return self._kind.quantize(weight) if weight.dim() == 2 and weight.shape[1] % 32 == 0 else None

    def blocks_reader(self, name: str) -> BlocksReader | None:
        return None

    def row_reader(self, name: str) -> Callable[[np.ndarray], Tensor] | None:
        return self._source.row_reader(name)

    def is_quantized(self) -> bool:
        return True


class LoadedWeights(NamedTuple):
    """How the projections came: as blocks alone (packed for a kernel form at load), as blocks beside
    their dequantized values, or as values only."""

    num_blocks_only: int
    num_with_blocks: int


@torch.no_grad()
def load_weights(
    model: LlamaForCausalLM, source: WeightSource, *, use_blocks: bool, kernels: Any | None, policy: MatmulPolicy
) -> LoadedWeights:
    """Copies the source's tensors into the model's parameters (every parameter covered exactly, shapes
    checked), projections from their blocks where `use_blocks` (see the module's note), and gives the
    output head the blocks a kernel form runs it on; then rebuilds the rotary table."""
    is_blocks_alone = policy.is_batch_invariant or (use_blocks and not _values_fit(model))
    targets = hf_targets(model)
    check_names(model, source.names())
    loaded: set[str] = set()
    if use_blocks:
        model.head_blocks = _head_blocks(model, source, kernels)
        loaded |= _embedding_from_file(model, source, is_head_kernel=is_blocks_alone and model.head_blocks is not None)
    kinds: list[str] = []
    for module_name, linear in model.named_modules():
        if isinstance(linear, Linear) and use_blocks:
            shard_names = _shard_names(module_name, model.config.architecture)
            kind = _load_projection(linear, shard_names, source, targets, kernels if is_blocks_alone else None)
            if kind is not None:
                kinds.append(kind)
                loaded.update(shard_names)
    for name, target in targets.items():
        if name not in loaded:
            _copy_in_chunks(name, source, *target)
    reset_rotary_tables(model)
    return LoadedWeights(kinds.count("blocks only"), kinds.count("with blocks"))


# NOTE: a load that keeps a quantized file's values (not batch-invariant) holds each projection in bfloat16
# twice, the values and oneDNN's copy, beside its packing: the 1B-shaped Q4_K_M 3.4 GB for a 0.64 GB file. It
# does so only where they take at most this share of the memory available as it starts.
_VALUES_SHARE_OF_AVAILABLE = 0.5


def _values_fit(model: LlamaForCausalLM) -> bool:
    """Whether the matmuls' bfloat16 forms (4 bytes a weight) fit the share of available memory a load may give them."""
    num_weights = sum(module.weight.numel() for module in model.modules() if isinstance(module, Linear))
    needed = 4 * (num_weights + model.lm_head_weight.numel())
    try:
        available = available_ram_bytes()
    except (OSError, RuntimeError):  # NOTE: no /proc/meminfo: as before this check
        return True
    if needed <= _VALUES_SHARE_OF_AVAILABLE * available:
        return True
    logger.warning(
        "not batch-invariant, but the matmuls' bfloat16 forms (%.1f GiB) would take more than half the available "
        "memory (%.1f GiB): the file's blocks alone, each on its kernel form, as a batch-invariant load",
        needed / 2**30, available / 2**30,
    )
    return False


def check_names(model: LlamaForCausalLM, names: set[str]) -> None:
    """Raises ValueError naming the tensors the model needs that `names` lacks, and those it has no place for."""
    targets = hf_targets(model)
    ignored = {name for name in names if name.endswith("rotary_emb.inv_freq")}
    if model.lm_head is None:
        ignored.add("lm_head.weight")
    missing, unexpected = sorted(targets.keys() - names), sorted(names - targets.keys() - ignored)
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match the {model.config.architecture} model: "
            f"missing {_first(missing)}, unexpected {_first(unexpected)}"
        )


def _load_projection(
    linear: Linear, shard_names: list[str], source: WeightSource, targets: dict[str, tuple[Tensor, int, int]],
    kernels: Any | None,
) -> str | None:
    """Gives a projection its file's blocks: alone, packed now, where `kernels` (a batch-invariant
    load's) have a form for them (parts of several types each on its own: the `parts` form); else
    beside its dequantized values. None where it has no blocks."""
    parts = [part for name in shard_names if (part := source.blocks(name)) is not None]
    if len(parts) < len(shard_names):
        return None
    if kernels is not None and len({type(part) for part in parts}) > 1:
        run = parts_form(kernels, parts, linear.bias)
        if run is not None:
            linear.kernels = kernels
            linear.set_parts(run)
            linear.prepack()
            return "blocks only"
    blocks = cat_blocks(parts)
    if kernels is not None and _has_kernel_form(kernels, blocks):
        linear.kernels = kernels
        linear.set_blocks(blocks, linear.weight.dtype, has_dense=False)
        linear.prepack()  # NOTE: packs its kernel form now, and lets go of the blocks
        return "blocks only"
    for name in shard_names:
        _copy(name, source.float(name), *targets[name])
    linear.set_blocks(blocks, linear.weight.dtype)
    return "with blocks"


def _embedding_from_file(model: LlamaForCausalLM, source: WeightSource, is_head_kernel: bool) -> set[str]:
    """Reads the token embedding a row at a time from the file where the source can (and a tied head
    does not need its values: a kernel form of its blocks serves it), and an untied head as its blocks
    alone where a kernel form serves it; returns the names so loaded, which take no values."""
    embed_name = "model.embed_tokens.weight"
    reader = source.row_reader(embed_name)
    names: set[str] = set()
    if reader is not None and (model.lm_head is not None or is_head_kernel):
        model.model.embed_rows = RowEmbedding(reader, model.lm_head_weight.dtype)
        names.add(embed_name)
        model.model.embed_tokens.weight.data = valueless(model.model.embed_tokens.weight)
    if is_head_kernel and (model.lm_head is not None or names):
        names.add("lm_head.weight" if model.lm_head is not None else embed_name)
        model.has_dense_head = False
        model.lm_head_weight.data = valueless(model.lm_head_weight)
    return names


def _has_kernel_form(kernels: Any, blocks: Blocks | BlocksReader) -> bool:
    """Whether a kernel form multiplies these blocks (tried on one block of them, so nothing big is packed twice)."""
    reader = blocks if isinstance(blocks, BlocksReader) else BlocksReader.of(blocks)
    sample = reader.read(slice(0, 16))
    return any(kernel_form(kernels, spec, sample) is not None for spec in KERNEL_FORMS)


def _head_blocks(model: LlamaForCausalLM, source: WeightSource, kernels: Any | None) -> BlocksReader | None:
    """The output head's blocks for a kernel form, read some rows at a time: the file's own where a form
    takes them, else (a quantized file's head in another type) its values rounded to Q8_0 blocks, as
    llama.cpp would."""
    name = "model.embed_tokens.weight" if model.lm_head is None else "lm_head.weight"
    if kernels is None:
        return None
    reader = source.blocks_reader(name)
    if reader is not None and _has_kernel_form(kernels, reader):
        return reader
    num_rows, num_cols = model.lm_head_weight.shape
    if not source.is_quantized() or num_cols % 32:
        return None
    return BlocksReader(Q8Blocks, num_rows, lambda rows: Q8Blocks.quantize(source.float(name, rows)))


# NOTE: an embedding is copied this many rows at a time: its float32 values whole would be the load's
# peak (a 49,152 × 2,048 table: 403 MB, twice its bfloat16 parameter).
_ROWS_PER_COPY = 4096


def _copy_in_chunks(name: str, source: WeightSource, param: Tensor, start: int, num_rows: int) -> None:
    """Copies a tensor `_ROWS_PER_COPY` rows at a time, where the source reads rows alone."""
    for row in range(0, num_rows, _ROWS_PER_COPY):
        rows = slice(row, min(row + _ROWS_PER_COPY, num_rows))
        values = source.float(name, rows)
        if values.shape[0] == num_rows:  # NOTE: all of it: a source that reads whole tensors, or a small one
            _copy(name, values, param, start, num_rows)
            return
        _copy(name, values, param, start + row, rows.stop - row)


def _copy(name: str, tensor: Tensor, param: Tensor, start: int, num_rows: int) -> None:
    target = param.narrow(0, start, num_rows)
    if tensor.shape != target.shape and tensor.squeeze().shape == target.squeeze().shape:
        tensor = tensor.view(target.shape)  # NOTE: a vector held as one row, or the reverse (a GGUF's shared expert gate)
    if tensor.shape != target.shape:
        raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(target.shape)}")
    target.copy_(tensor)


def _shard_names(module_name: str, architecture: str) -> list[str]:
    """The Hugging Face names of a projection's weight: its shards' for a fused one (unless the
    architecture's checkpoints hold it fused)."""
    fused = next((item for item in FUSED_PROJECTIONS if module_name.endswith(item[0])), None)
    if fused is None or family_of(architecture).is_fused_checkpoint:
        return [f"{module_name}.weight"]
    return [f"{module_name.removesuffix(fused[0])}{shard}.weight" for shard in fused[1]]


def hf_targets(model: LlamaForCausalLM) -> dict[str, tuple[Tensor, int, int]]:
    """Each Hugging Face name mapped to (parameter, first row, number of rows) it fills."""
    config = model.config
    targets: dict[str, tuple[Tensor, int, int]] = {}
    for name, param in model.named_parameters():
        fused = next((item for item in FUSED_PROJECTIONS if f".{item[0]}." in name), None)
        if fused is None or family_of(config.architecture).is_fused_checkpoint:
            targets[name] = (param, 0, param.shape[0])
            continue
        # NOTE: gate and up halves of their projection (a dense MLP's or an expert's, whose widths differ)
        half = param.shape[0] // 2
        shard_rows = {"q_proj": config.q_size, "k_proj": config.kv_size, "v_proj": config.kv_size, "gate_proj": half, "up_proj": half}
        start = 0
        for shard in fused[1]:
            targets[name.replace(fused[0], shard)] = (param, start, shard_rows[shard])
            start += shard_rows[shard]
    return targets


def _first(names: list[str], limit: int = 5) -> str:
    if not names:
        return "none"
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
