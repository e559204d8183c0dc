"""Tiny random BERT folders (Hugging Face format, float32): an encoder or a cross-encoder, the files
sentence-transformers keeps beside one, and a WordPiece tokenizer.json over its vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

TINY_BERT = dict(
    vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=64, type_vocab_size=2,
)


def save_tiny_bert(path: Path, kind: type[transformers.PreTrainedModel] = transformers.BertModel,
                   **overrides: object) -> transformers.PreTrainedModel:
    """A tiny random BERT saved under `path` (safetensors), returned in eval mode."""
    torch.manual_seed(0)
    model = kind(transformers.BertConfig(**TINY_BERT, **overrides)).eval()
    model.save_pretrained(path)
    return model


def write_sentence_transformers(path: Path, pooling: str, is_normalized: bool, max_seq_length: int = 48) -> None:
    """The files sentence-transformers keeps beside a model: its modules, pooling and sequence limit."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if is_normalized:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir()
    modes = {f"pooling_mode_{mode}": mode == pooling for mode in ("cls_token", "mean_tokens", "max_tokens", "lasttoken")}
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **modes}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))


WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "away", "big", "small", "##s", "##ed"]


def save_wordpiece_tokenizer(path: Path) -> None:
    """A BERT tokenizer.json over the tiny model's ids: [CLS] text [SEP], lower-cased WordPiece."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab_words = specials + WORDS + [f"w{i}" for i in range(int(TINY_BERT["vocab_size"]) - len(specials) - len(WORDS))]
    tokenizer = Tokenizer(models.WordPiece({word: i for i, word in enumerate(vocab_words)}, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tokenizer.save(str(path / "tokenizer.json"))
