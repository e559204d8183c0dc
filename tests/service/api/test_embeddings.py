"""POST /v1/embeddings on a served tiny random BERT folder, through the OpenAI SDK: each vector as
transformers gives it (float32), base64 equal to floats, usage counted, `dimensions`, and the bodies it
refuses with a 400 naming the field."""

from __future__ import annotations

import base64
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


@pytest.fixture(scope="module")
def server(embedder_dir: Path) -> Iterator[ServerProcess]:
    with local_server([str(embedder_dir), "--num-threads", "1"], stop_timeout_s=15) as server:
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


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"input": []}, "input", "empty"),
    ({"input": ""}, "input", "empty"),
    ({"input": ["fine", " ".join(["cat"] * 60)]}, "input", "'input[1]' has 62 tokens; this model takes at most 48"),
    ({"input": "cat", "dimensions": 64}, "input", "exceeds the model's 32"),
    ({"input": "cat", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
    ({"input": "cat", "encoding_format": "int8"}, "encoding_format", "float"),
    ({"input": "cat", "model": "nope"}, "model", "does not exist"),
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
