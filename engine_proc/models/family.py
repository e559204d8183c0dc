"""What one architecture is to the engine: its names, how its config and tensors read, the class that runs it.

Each family's module declares one `Family` and engine_proc/models/registry.py lists them, one line each; the
loaders read these facts from there and name no architecture themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from engine_proc.cpu.weight_blocks import Blocks

# NOTE: the fields a Hugging Face config.json or a GGUF's metadata gives ModelConfig, as read so far.
Fields = dict[str, Any]
# `read(key, default)`: a GGUF metadata value under the file's architecture prefix ("{arch}.{key}").
MetadataReader = Callable[[str, Any], Any]
# NOTE: a tensor of the model as a folder gives it: its values, or (a folder of quantized experts) its blocks,
# made when asked for.
FolderTensor = Tensor | Callable[[], Blocks]


def _unchanged_hf(raw: Mapping[str, Any], fields: Fields) -> Fields:
    return fields


def _unchanged_gguf(read: MetadataReader, fields: Fields) -> Fields:
    return fields


def _unchanged_tensors(tensors: dict[str, Tensor]) -> dict[str, FolderTensor]:
    return dict(tensors)


@dataclass(frozen=True)
class Family:
    """One architecture: its Hugging Face `model_type`s and GGUF `general.architecture` names, what its
    config and metadata add to the fields every family reads, its tensors' names, and its model class."""

    architecture: str  # the engine's name, ModelConfig.architecture
    model_class: Callable[[Any], Any]  # ModelConfig -> the model (an nn.Module: LlamaForCausalLM or a subclass)
    hf_model_types: tuple[str, ...] = ()
    gguf_architectures: tuple[str, ...] = ()
    # (config.json, fields read as the Llama family's) -> this family's fields
    hf_config: Callable[[Mapping[str, Any], Fields], Fields] = _unchanged_hf
    # (metadata reader, fields read as the Llama family's) -> this family's fields
    gguf_config: Callable[[MetadataReader, Fields], Fields] = _unchanged_gguf
    # GGUF layer tensor names of its own (`attn_qkv`) -> the model's names after `model.layers.N.`
    gguf_layer_names: Mapping[str, str] = field(default_factory=dict)
    # (checkpoint's piece, the model's) replaced in a folder's tensor names (Mixtral's `block_sparse_moe.`)
    hf_renames: tuple[tuple[str, str], ...] = ()
    # a folder's tensors (as the model names them, after `hf_renames`) -> the model's, views of them where it can
    # (gpt-oss's experts: a layer's in one tensor, split one an expert); also given meta tensors, for their names
    hf_tensors: Callable[[dict[str, Tensor]], dict[str, FolderTensor]] = _unchanged_tensors
    is_fused_checkpoint: bool = False  # a folder holds Q/K/V and gate/up fused, as the model runs them
    is_norm_shifted: bool = False  # a folder holds norm weights as w for (1 + w); the model holds (1 + w)
    is_gguf_permuted: bool = False  # llama.cpp's converter permuted its GGUF Q/K rows (the llama architecture's)
    has_experts: bool = False  # mixture-of-experts layers

    def hf_name(self, name: str) -> str:
        """A folder's tensor name as the model names it."""
        for piece, replacement in self.hf_renames:
            name = name.replace(piece, replacement)
        return name
