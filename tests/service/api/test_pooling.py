"""The pooling routes on served tiny random BERT folders. /v1/embeddings through the OpenAI SDK: each vector as
transformers gives it (float32), base64 equal to floats, usage counted, `dimensions`. /v1/rerank, /rerank and
/v1/score: a cross-encoder's scores as transformers gives them (through the sigmoid of one label), best first,
and an embedding model's cosines. Bad bodies: a 400 naming the field."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers
from tokenizers import Tokenizer

from service.bench.local_server import ServerProcess, local_server
from tests.engine_proc.models.tiny_bert import save_tiny_bert, save_wordpiece_tokenizer, write_sentence_transformers

TEXTS = ["The cat sat on the mat", "a dog ran far away", "cats", "The big dog sat on a small cat"]


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny-embedder"
    path.mkdir()
    save_tiny_bert(path)
    write_sentence_transformers(path, "mean_tokens", is_normalized=True, max_seq_length=48)
    save_wordpiece_tokenizer(path)
    return path


def serving(folder: Path) -> contextlib.AbstractContextManager[ServerProcess]:
    """The folder served in float32 (the references are), on one engine thread."""
    return local_server([str(folder), "--num-threads", "1", "--dtype", "float32"], stop_timeout_s=15)


@pytest.fixture(scope="module")
def server(embedder_dir: Path) -> Iterator[ServerProcess]:
    with serving(embedder_dir) as server:
        yield server


@pytest.fixture(scope="module")
def reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "tiny-reranker"
    path.mkdir()
    save_tiny_bert(path, transformers.BertForSequenceClassification, num_labels=1)
    save_wordpiece_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def reranker(reranker_dir: Path) -> Iterator[ServerProcess]:
    with serving(reranker_dir) as server:
        yield server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def reference_vectors(path: Path, texts: list[str]) -> list[np.ndarray]:
    """sentence-transformers' recipe in transformers: the encoder's states, their mean, unit length."""
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    model = transformers.BertModel.from_pretrained(path).eval()
    vectors = []
    for text in texts:
        with torch.inference_mode():
            states = model(input_ids=torch.tensor([tokenizer.encode(text).ids])).last_hidden_state[0]
        vectors.append(torch.nn.functional.normalize(states.mean(0), dim=0).numpy())
    return vectors


def test_the_sdk_gets_each_texts_vector_as_transformers_does(client: openai.OpenAI, embedder_dir: Path) -> None:
    result = client.embeddings.create(model="tiny-embedder", input=TEXTS)
    assert [item.index for item in result.data] == [0, 1, 2, 3]
    tokenizer = Tokenizer.from_file(str(embedder_dir / "tokenizer.json"))
    assert result.usage.prompt_tokens == result.usage.total_tokens == sum(len(tokenizer.encode(t).ids) for t in TEXTS)
    for item, expected in zip(result.data, reference_vectors(embedder_dir, TEXTS), strict=True):
        assert len(item.embedding) == 32
        np.testing.assert_allclose(item.embedding, expected, atol=1e-5)


def test_base64_holds_the_same_floats(client: openai.OpenAI, server: ServerProcess) -> None:
    floats = client.embeddings.create(model="tiny-embedder", input=TEXTS[0], encoding_format="float").data[0].embedding
    raw = httpx.post(f"{server.base_url}/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == floats


def test_token_ids_embed_as_their_text(client: openai.OpenAI, embedder_dir: Path) -> None:
    token_ids = Tokenizer.from_file(str(embedder_dir / "tokenizer.json")).encode(TEXTS[1]).ids
    by_ids = client.embeddings.create(model="tiny-embedder", input=[token_ids], encoding_format="float")
    by_text = client.embeddings.create(model="tiny-embedder", input=TEXTS[1], encoding_format="float")
    assert by_ids.data[0].embedding == by_text.data[0].embedding


def test_dimensions_cut_each_vector_to_unit_length(client: openai.OpenAI) -> None:
    result = client.embeddings.create(model="tiny-embedder", input=TEXTS[:2], dimensions=8, encoding_format="float")
    for item in result.data:
        assert len(item.embedding) == 8
        assert np.linalg.norm(item.embedding) == pytest.approx(1.0, abs=1e-5)


def test_truncate_prompt_tokens_keeps_an_inputs_first_tokens(client: openai.OpenAI, embedder_dir: Path) -> None:
    long_text = " ".join(["the big cat sat on a small mat"] * 10)
    whole = client.embeddings.create(model="tiny-embedder", input=long_text, encoding_format="float",
                                     extra_body={"truncate_prompt_tokens": -1})
    assert whole.usage.prompt_tokens == 48  # NOTE: the folder's max_seq_length
    cut = client.embeddings.create(model="tiny-embedder", input=long_text, encoding_format="float",
                                   extra_body={"truncate_prompt_tokens": 10})
    assert cut.usage.prompt_tokens == 10
    first_words = " ".join(long_text.split()[:8])  # NOTE: 8 tokens of text, then [CLS] and [SEP]
    expected = client.embeddings.create(model="tiny-embedder", input=first_words, encoding_format="float")
    assert cut.data[0].embedding == expected.data[0].embedding


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": []}, "input", "empty"),
    ({"input": ""}, "input", "empty"),
    ({"input": ["fine", " ".join(["cat"] * 60)]}, "input", "'input[1]' has 62 tokens; this model takes at most 48"),
    ({"input": "cat", "dimensions": 64}, "input", "exceeds the model's 32"),
    ({"input": "cat", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
    ({"input": "cat", "encoding_format": "int8"}, "encoding_format", "float"),
    ({"input": "cat", "model": "nope"}, "model", "does not exist"),
    ({"input": "cat", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens", "count of tokens"),
    ({"input": "cat", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens", "greater than or equal to -1"),
])
def test_a_bad_body_is_a_400_naming_the_field(server: ServerProcess, body: dict[str, object], param: str,
                                              words: str) -> None:
    response = httpx.post(f"{server.base_url}/v1/embeddings", json=body)
    assert response.status_code == (404 if param == "model" else 400), response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


def test_an_embedding_model_refuses_to_generate(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="does not generate") as caught:
        client.completions.create(model="tiny-embedder", prompt="the cat", max_tokens=2)
    assert caught.value.body["param"] == "model"  # type: ignore[index]


QUERY = "the cat sat"
DOCUMENTS = ["a dog ran far away", "the cat sat on the mat", "big cats", "small dogs sat"]


def cross_encoder_scores(path: Path, pairs: list[tuple[str, str]]) -> list[float]:
    """transformers' logits of each pair (BERT's two segments), through a sigmoid: sentence-transformers' score."""
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    model = transformers.BertForSequenceClassification.from_pretrained(path).eval()
    scores = []
    for first, second in pairs:
        encoding = tokenizer.encode(first, second)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([encoding.ids]), token_type_ids=torch.tensor([encoding.type_ids])).logits
        scores.append(float(logits.sigmoid()[0, 0]))
    return scores


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_orders_documents_by_the_cross_encoders_scores(reranker: ServerProcess, reranker_dir: Path,
                                                              path: str) -> None:
    response = httpx.post(f"{reranker.base_url}{path}", json={"query": QUERY, "documents": DOCUMENTS})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    expected = cross_encoder_scores(reranker_dir, [(QUERY, document) for document in DOCUMENTS])
    assert [r["index"] for r in results] == sorted(range(len(DOCUMENTS)), key=lambda index: -expected[index])
    for result in results:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}


def test_rerank_takes_cohere_documents_top_n_and_leaves_documents_out(reranker: ServerProcess) -> None:
    whole = httpx.post(f"{reranker.base_url}/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS}).json()
    body = {"query": QUERY, "documents": [{"text": d} for d in DOCUMENTS], "top_n": 2, "return_documents": False}
    top = httpx.post(f"{reranker.base_url}/v1/rerank", json=body).json()
    assert top["results"] == [{k: v for k, v in r.items() if k != "document"} for r in whole["results"][:2]]
    assert top["usage"]["total_tokens"] > 0


def test_score_pairs_one_text_with_each_and_pair_by_pair(reranker: ServerProcess, reranker_dir: Path) -> None:
    one_to_many = httpx.post(f"{reranker.base_url}/v1/score", json={"text_1": QUERY, "text_2": DOCUMENTS}).json()
    expected = cross_encoder_scores(reranker_dir, [(QUERY, document) for document in DOCUMENTS])
    assert [item["index"] for item in one_to_many["data"]] == list(range(len(DOCUMENTS)))
    assert [item["score"] for item in one_to_many["data"]] == pytest.approx(expected, abs=1e-5)
    pairwise = httpx.post(f"{reranker.base_url}/v1/score", json={"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[2:]})
    expected_pairs = cross_encoder_scores(reranker_dir, list(zip(DOCUMENTS[:2], DOCUMENTS[2:], strict=True)))
    assert [item["score"] for item in pairwise.json()["data"]] == pytest.approx(expected_pairs, abs=1e-5)


def test_an_embedding_model_reranks_by_cosine(server: ServerProcess, embedder_dir: Path) -> None:
    response = httpx.post(f"{server.base_url}/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    vectors = reference_vectors(embedder_dir, [QUERY, *DOCUMENTS])
    expected = [float(vectors[0] @ vector) for vector in vectors[1:]]
    for result in response.json()["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]], abs=1e-5)


@pytest.mark.parametrize(("path", "body", "param", "words"), [
    ("/v1/rerank", {"query": QUERY, "documents": []}, "documents", "empty"),
    ("/v1/rerank", {"query": QUERY, "documents": [" ".join(["cat"] * 70)]}, "documents", "at most 64"),
    ("/v1/rerank", {"documents": DOCUMENTS}, "query", "Field required"),
    ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": -1}, "top_n", "greater than or equal to 0"),
    ("/v1/score", {"text_1": DOCUMENTS[:2], "text_2": DOCUMENTS[:3]}, "text_2", "'text_1' has 2 texts"),
])
def test_a_bad_pair_body_is_a_400_naming_the_field(reranker: ServerProcess, path: str, body: dict[str, object],
                                                   param: str, words: str) -> None:
    response = httpx.post(f"{reranker.base_url}{path}", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], words in error["message"]) == (param, True), error
