"""Build a ready model from a GGUF file or a Hugging Face directory."""

from __future__ import annotations

from pathlib import Path

import torch

from engine_proc.loader.gguf_loader import load_gguf, load_gguf_config
from engine_proc.loader.hf_loader import load_hf_config, load_hf_dir
from engine_proc.models.config import ModelConfig
from engine_proc.models.llama import LlamaForCausalLM

__all__ = ["load_gguf", "load_hf_dir", "load_model", "load_model_config"]


def load_model_config(path: str | Path) -> ModelConfig:
    """The config of a `.gguf` file or a Hugging Face directory, without reading the weights."""
    return load_gguf_config(path) if _is_gguf(path) else load_hf_config(path)


def load_model(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> LlamaForCausalLM:
    """Load a `.gguf` file or a Hugging Face directory into an inference-ready model."""
    config, weights = load_gguf(path) if _is_gguf(path) else load_hf_dir(path)
    # NOTE: built on the meta device so no memory or time goes to random initialisation.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    model.load_weights(weights)
    return model.eval().requires_grad_(False)


def _is_gguf(path: str | Path) -> bool:
    resolved = Path(path)
    if resolved.is_file() and resolved.suffix == ".gguf":
        return True
    if resolved.is_dir():
        return False
    raise FileNotFoundError(f"{resolved} is neither a .gguf file nor a model directory")
