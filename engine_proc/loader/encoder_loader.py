"""Load an encoder folder (a BERT-family config.json with *.safetensors, and its sentence-transformers
pooling where it has one) as a ready BertModel."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from engine_proc.models.bert import BertConfig, BertModel, bert_state_dict
from engine_proc.models.pooling import PoolingConfig


def load_encoder(path: str | Path, dtype: torch.dtype, device: torch.device) -> tuple[BertModel, PoolingConfig]:
    """The folder's encoder, its weights in `dtype` on `device`, and how its texts become vectors."""
    root = Path(path)
    config = BertConfig.from_hf(json.loads((root / "config.json").read_text()))
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{root} has no *.safetensors files")
    tensors: dict[str, Tensor] = {}
    for file in files:
        tensors.update(load_file(file))
    state = bert_state_dict(tensors)
    if not config.num_labels:
        state = {name: tensor for name, tensor in state.items() if not name.startswith("pooler.")}
    model = BertModel(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{root}: tensors missing {sorted(missing)[:5]}, not of this model {sorted(unexpected)[:5]}")
    return model.to(device=device, dtype=dtype).eval(), PoolingConfig.from_folder(root)
