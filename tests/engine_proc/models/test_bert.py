"""Our BERT encoder against transformers' on tiny random checkpoints (float32): hidden states, the
sentence-transformers pooling a folder names, and a cross-encoder's scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers

from engine_proc.loader.encoder_loader import load_encoder
from engine_proc.models.pooling import PoolingConfig
from proto.model_support import is_encoder_folder
from tests.engine_proc.models.tiny_bert import save_tiny_bert, write_sentence_transformers

TEXTS = [[2, 17, 45, 3], [2, 9, 9, 81, 55, 60, 3], [2, 3], [2, 40, 41, 42, 43, 44, 45, 46, 47, 48, 3]]


def run_ours(path: Path, texts: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    model, _ = load_encoder(path, torch.float32, torch.device("cpu"))
    seq_lens = [len(text) for text in texts]
    input_ids = torch.tensor([token for text in texts for token in text])
    positions = torch.cat([torch.arange(n) for n in seq_lens])
    with torch.inference_mode():
        return model(input_ids, positions, torch.zeros_like(input_ids), seq_lens), seq_lens


def test_hidden_states_match_transformers_text_by_text(tmp_path: Path) -> None:
    reference = save_tiny_bert(tmp_path)
    assert is_encoder_folder(tmp_path)
    hidden, seq_lens = run_ours(tmp_path, TEXTS)
    for text, ours in zip(TEXTS, hidden.split(seq_lens), strict=True):
        with torch.inference_mode():
            expected = reference(input_ids=torch.tensor([text])).last_hidden_state[0]
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("pooling", "is_normalized"), [("mean_tokens", True), ("cls_token", False),
                                                        ("max_tokens", True), ("lasttoken", False)])
def test_vectors_pool_as_the_folder_says(tmp_path: Path, pooling: str, is_normalized: bool) -> None:
    reference = save_tiny_bert(tmp_path)
    write_sentence_transformers(tmp_path, pooling, is_normalized)
    config = PoolingConfig.from_folder(tmp_path)
    assert config.max_seq_length == 48
    hidden, seq_lens = run_ours(tmp_path, TEXTS)
    vectors = config.pool(hidden, seq_lens)
    for text, ours in zip(TEXTS, vectors, strict=True):
        with torch.inference_mode():
            states = reference(input_ids=torch.tensor([text])).last_hidden_state[0]
        expected = {"mean_tokens": states.mean(0), "cls_token": states[0], "max_tokens": states.amax(0),
                    "lasttoken": states[-1]}[pooling]
        if is_normalized:
            expected = F.normalize(expected, dim=0)
            assert ours.norm().item() == pytest.approx(1.0, abs=1e-5)
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_a_folder_without_sentence_transformers_files_takes_cls_at_unit_length(tmp_path: Path) -> None:
    save_tiny_bert(tmp_path)
    assert PoolingConfig.from_folder(tmp_path) == PoolingConfig("cls", is_normalized=True, max_seq_length=None)


def test_a_pooling_zeroserve_does_not_run_is_named(tmp_path: Path) -> None:
    save_tiny_bert(tmp_path)
    write_sentence_transformers(tmp_path, "mean_tokens", True)
    config = json.loads((tmp_path / "1_Pooling" / "config.json").read_text())
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({**config, "pooling_mode_weightedmean_tokens": True}))
    with pytest.raises(ValueError, match="pooling_mode_weightedmean_tokens"):
        PoolingConfig.from_folder(tmp_path)


@pytest.mark.parametrize("activation", [None, "torch.nn.modules.linear.Identity"])
def test_a_cross_encoder_scores_pairs_as_its_card_says(tmp_path: Path, activation: str | None) -> None:
    reference = save_tiny_bert(tmp_path, transformers.BertForSequenceClassification, num_labels=1)
    if activation is not None:
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, "sbert_ce_default_activation_function": activation}))
    model, _ = load_encoder(tmp_path, torch.float32, torch.device("cpu"))
    query, document = [2, 17, 45, 3], [9, 81, 55, 3]
    input_ids = torch.tensor(query + document)
    token_type_ids = torch.tensor([0] * len(query) + [1] * len(document))
    with torch.inference_mode():
        hidden = model(input_ids, torch.arange(len(input_ids)), token_type_ids, [len(input_ids)])
        score = model.classify(hidden[:1])
        logits = reference(input_ids=input_ids[None], token_type_ids=token_type_ids[None]).logits
    # NOTE: sentence-transformers' CrossEncoder: a sigmoid over one label, unless the card names another activation.
    torch.testing.assert_close(score, logits if activation else torch.sigmoid(logits), atol=1e-5, rtol=1e-5)
