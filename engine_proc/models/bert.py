"""BERT-family encoders (BertModel and the encoder inside BertForSequenceClassification): every token
attends to every other token of its own text, so a batch is texts laid end to end, each attended alone."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# NOTE: the activations BERT configs name (transformers' ACT2FN): "gelu" is the exact erf one.
_ACTIVATIONS = {"gelu": F.gelu, "gelu_new": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


@dataclass(frozen=True)
class BertConfig:
    """The shape of a BERT encoder, as its config.json gives it."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    num_labels: int = 0  # a cross-encoder's classifier outputs (0: an encoder alone)
    # NOTE: what turns a cross-encoder's logits into its scores: sigmoid for one label unless the card's
    # sentence-transformers config says otherwise (ms-marco's say Identity), as sentence-transformers and vLLM do.
    is_score_sigmoid: bool = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of {self.num_attention_heads} heads")
        if self.hidden_act not in _ACTIVATIONS:
            raise ValueError(f"unsupported activation {self.hidden_act!r}; supported: {', '.join(_ACTIVATIONS)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_hf(cls, raw: Mapping[str, Any]) -> BertConfig:
        architectures = raw.get("architectures") or []
        is_classifier = any(name.endswith("ForSequenceClassification") for name in architectures)
        num_labels = len(raw.get("id2label") or {}) or int(raw.get("num_labels", 1)) if is_classifier else 0
        return cls(
            vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"], num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=raw["num_attention_heads"], intermediate_size=raw["intermediate_size"],
            max_position_embeddings=raw["max_position_embeddings"], type_vocab_size=raw.get("type_vocab_size", 2),
            layer_norm_eps=raw.get("layer_norm_eps", 1e-12), hidden_act=raw.get("hidden_act", "gelu"),
            num_labels=num_labels, is_score_sigmoid=_activation_of(raw) != "Identity" and num_labels == 1,
        )


def _activation_of(raw: Mapping[str, Any]) -> str:
    """The class name of the activation a cross-encoder's sentence-transformers config names ("" for none)."""
    named = raw.get("sbert_ce_default_activation_function") or (raw.get("sentence_transformers") or {}).get("activation_fn")
    return str(named or "").rsplit(".", 1)[-1]


class BertEmbeddings(nn.Module):
    """Token, position and segment embeddings, summed and normalised."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: Tensor, positions: Tensor, token_type_ids: Tensor) -> Tensor:
        summed = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        return self.LayerNorm(summed + self.position_embeddings(positions))


class BertLayer(nn.Module):
    """Self-attention over each text alone, then the feed-forward block; each adds to its input, then normalises."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attention_output = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(hidden, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.activation = _ACTIVATIONS[config.hidden_act]

    def forward(self, hidden: Tensor, seq_lens: Sequence[int]) -> Tensor:
        attended = self.attention_norm(hidden + self.attention_output(self._attend(hidden, seq_lens)))
        return self.output_norm(attended + self.output(self.activation(self.intermediate(attended))))

    def _attend(self, hidden: Tensor, seq_lens: Sequence[int]) -> Tensor:
        # NOTE: one text at a time, so a text's attention is what it would be alone, whatever shares the batch;
        # written out (two matmuls and a float32 softmax), not SDPA, whose masking checks cost more than
        # the product at a text's length.
        scale = 1 / math.sqrt(self.head_dim)
        outputs = []
        for q, k, v in zip(*(self._heads(proj(hidden), seq_lens) for proj in (self.query, self.key, self.value)),
                           strict=True):
            weights = torch.matmul(q, k.transpose(1, 2)).float().mul_(scale).softmax(dim=-1).to(v.dtype)
            outputs.append(torch.matmul(weights, v).transpose(0, 1).reshape(-1, self.num_heads * self.head_dim))
        return torch.cat(outputs)

    def _heads(self, projected: Tensor, seq_lens: Sequence[int]) -> list[Tensor]:
        """[tokens, hidden] -> one [heads, text's tokens, head_dim] a text."""
        return [t.view(-1, self.num_heads, self.head_dim).transpose(0, 1) for t in projected.split(list(seq_lens))]


class BertModel(nn.Module):
    """The encoder: token ids of texts laid end to end in, each token's last hidden state out; with
    `num_labels`, also the classifier a cross-encoder scores with (over each text's first token)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler: nn.Linear | None = None
        self.classifier: nn.Linear | None = None
        if config.num_labels:
            self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids: Tensor, positions: Tensor, token_type_ids: Tensor, seq_lens: Sequence[int]) -> Tensor:
        hidden = self.embeddings(input_ids, positions, token_type_ids)
        for layer in self.layers:
            hidden = layer(hidden, seq_lens)
        return hidden

    def classify(self, first_hidden: Tensor) -> Tensor:
        """A cross-encoder's scores from each text's first ([CLS]) hidden state: its logits, through a
        sigmoid where the model's card says so."""
        if self.pooler is None or self.classifier is None:
            raise ValueError("this encoder has no classifier: it embeds, it does not score pairs")
        logits = self.classifier(torch.tanh(self.pooler(first_hidden)))
        return torch.sigmoid(logits) if self.config.is_score_sigmoid else logits


# (a checkpoint's piece, ours) replaced in its tensor names, in order.
_HF_RENAMES = (
    ("attention.self.query.", "query."), ("attention.self.key.", "key."), ("attention.self.value.", "value."),
    ("attention.output.dense.", "attention_output."), ("attention.output.LayerNorm.", "attention_norm."),
    ("intermediate.dense.", "intermediate."), ("output.dense.", "output."), ("output.LayerNorm.", "output_norm."),
    ("encoder.layer.", "layers."), ("pooler.dense.", "pooler."),
)


def bert_state_dict(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A checkpoint's tensors under BertModel's names (a classifier's `bert.` prefix dropped, the
    unused position-id buffer and, for an encoder alone, the unused pooler left out)."""
    state = {}
    for name, tensor in tensors.items():
        name = name.removeprefix("bert.")
        if name.endswith("position_ids"):
            continue
        for piece, replacement in _HF_RENAMES:
            name = name.replace(piece, replacement)
        state[name] = tensor
    return state
