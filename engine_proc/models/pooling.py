"""From each token's hidden state to one vector a text, as a sentence-transformers folder says (its
modules.json, 1_Pooling/config.json and Normalize), or as vLLM defaults where a folder says nothing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

# sentence-transformers' pooling modes (1_Pooling/config.json's `pooling_mode_*` keys) -> ours.
_MODES = {"cls_token": "cls", "mean_tokens": "mean", "max_tokens": "max", "lasttoken": "last"}
METHODS = tuple(_MODES.values())


@dataclass(frozen=True)
class PoolingConfig:
    """How a model's texts become vectors: which tokens' states make the vector, whether it is scaled to
    unit length, and how many tokens the model card says a text may have (None: the model's own limit)."""

    method: str = "cls"
    is_normalized: bool = True
    max_seq_length: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unsupported pooling {self.method!r}; supported: {', '.join(METHODS)}")

    @classmethod
    def from_folder(cls, path: Path, default_method: str = "cls") -> PoolingConfig:
        """The folder's sentence-transformers pooling; without one, `default_method` and unit length (as
        vLLM embeds: CLS for encoders, the last token for decoders)."""
        modules = _read_json(path / "modules.json")
        if not isinstance(modules, list):
            return cls(default_method)
        types = {str(module.get("type", "")).rsplit(".", 1)[-1]: module for module in modules}
        method = default_method
        if "Pooling" in types:
            pooling = _read_json(path / types["Pooling"].get("path", "") / "config.json") or {}
            chosen = [ours for mode, ours in _MODES.items() if pooling.get(f"pooling_mode_{mode}")]
            others = [key for key, value in pooling.items()
                      if key.startswith("pooling_mode_") and value and key.removeprefix("pooling_mode_") not in _MODES]
            if others or len(chosen) != 1:
                raise ValueError(f"{path}: pooling {sorted(others) or chosen} is not one zeroserve runs "
                                 f"(one of {', '.join(METHODS)})")
            method = chosen[0]
        bert_config = _read_json(path / "sentence_bert_config.json") or {}
        max_seq_length = bert_config.get("max_seq_length")
        return cls(method, "Normalize" in types, int(max_seq_length) if max_seq_length else None)

    def pool(self, hidden: Tensor, seq_lens: Sequence[int]) -> Tensor:
        """[texts' tokens laid end to end, hidden] -> [texts, hidden] in float32."""
        texts = hidden.float().split(list(seq_lens))
        if self.method == "cls":
            pooled = torch.stack([text[0] for text in texts])
        elif self.method == "last":
            pooled = torch.stack([text[-1] for text in texts])
        elif self.method == "mean":
            pooled = torch.stack([text.mean(dim=0) for text in texts])
        else:
            pooled = torch.stack([text.amax(dim=0) for text in texts])
        return F.normalize(pooled, p=2, dim=1) if self.is_normalized else pooled


def _read_json(path: Path) -> object:
    return json.loads(path.read_text()) if path.is_file() else None
