"""EncoderCore on tiny random BERTs: each text's vector as the model alone gives it, batched by the token
budget, alike alone and among 32 others, and the requests it cannot run answered with why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from engine_proc.core import make_core
from engine_proc.encoder_core import EncoderCore
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, PoolingParams, SamplingParams
from proto.engine_output import FinishReason
from tests.engine_proc.models.tiny_bert import save_tiny_bert, write_sentence_transformers


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-bert")
    save_tiny_bert(path)
    write_sentence_transformers(path, "mean_tokens", is_normalized=True, max_seq_length=48)
    return path


def embed(request_id: str, token_ids: list[int], dimensions: int | None = None) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, token_ids, SamplingParams(), pooling_params=PoolingParams(dimensions=dimensions))


def texts(num_texts: int) -> list[list[int]]:
    generator = np.random.default_rng(0)
    return [[2, *generator.integers(4, 99, size=int(generator.integers(1, 40))).tolist(), 3] for _ in range(num_texts)]


def run_all(core: EncoderCore) -> dict[str, np.ndarray]:
    vectors = {}
    while core.has_work:
        for output in core.step().outputs:
            assert output.finish_reason == FinishReason.STOP, output.stop_reason
            assert output.pooled is not None
            vectors[output.request_id] = output.pooled
    return vectors


def expected_vector(path: Path, token_ids: list[int]) -> torch.Tensor:
    reference = transformers.BertModel.from_pretrained(path).eval()
    with torch.inference_mode():
        states = reference(input_ids=torch.tensor([token_ids])).last_hidden_state[0]
    return torch.nn.functional.normalize(states.mean(0), dim=0)


def test_an_encoder_folder_gets_an_encoder_core_that_says_so(encoder_dir: Path) -> None:
    core = make_core(EngineConfig(model_path=str(encoder_dir), dtype="float32"))
    assert isinstance(core, EncoderCore)
    ready = core.ready_message()
    assert (ready.runner, ready.max_model_len, ready.vocab_size) == ("pooling", 48, 99)


def test_each_text_gets_its_own_vector_in_budgeted_steps(encoder_dir: Path) -> None:
    core = EncoderCore(EngineConfig(model_path=str(encoder_dir), dtype="float32", max_num_batched_tokens=64))
    batch = texts(12)
    for index, token_ids in enumerate(batch):
        core.add_request(embed(str(index), token_ids))
    vectors = run_all(core)
    assert core.num_steps > 1  # NOTE: 12 texts of up to 41 tokens do not fit one 64-token step
    for index, token_ids in enumerate(batch):
        torch.testing.assert_close(torch.from_numpy(vectors[str(index)]), expected_vector(encoder_dir, token_ids),
                                   atol=1e-5, rtol=1e-5)


def test_a_text_embeds_alike_alone_and_among_32(encoder_dir: Path) -> None:
    # NOTE: each text attends alone, but the matmuls take all the step's rows: bit for bit on an AVX-512 Zen 5,
    # a last-bit difference on AVX2 (torch's float32 GEMM picks its kernel by the number of rows).
    core = EncoderCore(EngineConfig(model_path=str(encoder_dir), dtype="float32", max_num_batched_tokens=4096))
    batch = texts(32)
    core.add_request(embed("alone", batch[7]))
    alone = run_all(core)["alone"]
    for index, token_ids in enumerate(batch):
        core.add_request(embed(str(index), token_ids))
    among = run_all(core)
    assert core.num_steps == 2  # NOTE: the text alone, then all 32 in one forward
    np.testing.assert_allclose(alone, among["7"], rtol=0, atol=1e-6)


def test_dimensions_cut_the_vector_and_keep_it_unit_length(encoder_dir: Path) -> None:
    core = EncoderCore(EngineConfig(model_path=str(encoder_dir), dtype="float32"))
    core.add_request(embed("whole", texts(1)[0]))
    core.add_request(embed("cut", texts(1)[0], dimensions=8))
    vectors = run_all(core)
    assert vectors["cut"].shape == (8,)
    assert np.linalg.norm(vectors["cut"]) == pytest.approx(1.0, abs=1e-5)
    whole = vectors["whole"][:8]
    np.testing.assert_allclose(vectors["cut"], whole / np.linalg.norm(whole), atol=1e-6)


def test_a_cross_encoder_scores_a_pair(tmp_path: Path) -> None:
    reference = save_tiny_bert(tmp_path, transformers.BertForSequenceClassification, num_labels=1)
    core = EncoderCore(EngineConfig(model_path=str(tmp_path), dtype="float32"))
    pair, segments = [2, 17, 45, 3, 9, 81, 55, 3], [0, 0, 0, 0, 1, 1, 1, 1]
    core.add_request(EngineCoreRequest("pair", pair, SamplingParams(), pooling_params=PoolingParams("score"),
                                       token_type_ids=segments))
    score = run_all(core)["pair"]
    with torch.inference_mode():
        expected = reference(input_ids=torch.tensor([pair]), token_type_ids=torch.tensor([segments])).logits[0].sigmoid()
    torch.testing.assert_close(torch.from_numpy(score), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("request_", "reason"), [
    (EngineCoreRequest("gen", [2, 5, 3], SamplingParams()), "does not generate"),
    (embed("long", [2] + [5] * 60 + [3]), "invalid prompt length"),
    (embed("oov", [2, 500, 3]), "outside the vocabulary"),
    (EngineCoreRequest("score", [2, 5, 3], SamplingParams(), pooling_params=PoolingParams("score")), "no classifier"),
    (embed("wide", [2, 5, 3], dimensions=64), "exceeds the model's 32"),
])
def test_what_it_cannot_run_ends_with_the_reason(encoder_dir: Path, request_: EngineCoreRequest, reason: str) -> None:
    core = EncoderCore(EngineConfig(model_path=str(encoder_dir), dtype="float32"))
    core.add_request(request_)
    [output] = core.step().outputs
    assert output.finish_reason == FinishReason.ERROR
    assert reason in str(output.stop_reason)


def test_an_aborted_text_is_not_run(encoder_dir: Path) -> None:
    core = EncoderCore(EngineConfig(model_path=str(encoder_dir), dtype="float32"))
    core.add_request(embed("kept", [2, 5, 3]))
    core.add_request(embed("aborted", [2, 6, 3]))
    core.abort_requests(["aborted"])
    assert set(run_all(core)) == {"kept"}
