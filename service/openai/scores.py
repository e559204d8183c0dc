"""Scores of text pairs: vLLM's POST /v1/score (text_1 against text_2) and its, Jina's and Cohere's
/v1/rerank (a query against documents, best first), as llama.cpp's /rerank too. A cross-encoder reads each
pair at once; an embedding model scores the cosine of the two texts' vectors, as vLLM's do."""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
from pydantic import Field

from proto.engine_input import EngineCoreRequest, PoolingParams
from proto.engine_input import SamplingParams as EngineSamplingParams
from service.frontend.async_llm import AsyncLLM, EngineRequestError
from service.openai.errors import APIError
from service.openai.protocol import OpenAIModel


class RerankDocument(OpenAIModel):
    """A document as Cohere's bodies may give it: an object with its text."""

    text: str


class RerankRequest(OpenAIModel):
    """A query and the documents to order by how well each answers it."""

    model: str | None = None
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = Field(default=None, ge=0)  # NOTE: 0 or none: every document, as vLLM
    return_documents: bool = True

    def texts(self) -> list[str]:
        return [document if isinstance(document, str) else document.text for document in self.documents]


class ScoreRequest(OpenAIModel):
    """vLLM's pairs to score: one text against each of the others, or the two lists pair by pair."""

    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]

    def pairs(self) -> list[tuple[str, str]]:
        firsts = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        seconds = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if not firsts or not seconds:
            raise APIError("'text_1' and 'text_2' must each hold a text.", param="text_1" if not firsts else "text_2")
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        if len(firsts) != len(seconds):
            raise APIError(f"'text_1' has {len(firsts)} texts and 'text_2' {len(seconds)}: give one text_1, or as "
                           "many as text_2.", param="text_2")
        return list(zip(firsts, seconds, strict=True))


async def pair_scores(llm: AsyncLLM, pairs: list[tuple[str, str]], param: str) -> tuple[list[float], int]:
    """Each pair's score and the tokens read; a pair longer than the model takes is a 400 naming `param`
    (the field that holds its second text)."""
    if not pairs:
        raise APIError(f"'{param}' is empty.", param=param)
    if "score" in llm.ready.pooling_tasks:
        return await _cross_encoded(llm, pairs, param)
    return await _cosines(llm, pairs, param)


async def _cross_encoded(llm: AsyncLLM, pairs: list[tuple[str, str]], param: str) -> tuple[list[float], int]:
    request_id, max_len = f"score-{uuid.uuid4().hex}", llm.ready.max_model_len
    requests = []
    for index, (first, second) in enumerate(pairs):
        token_ids, type_ids = llm.tokenizer.encode_pair(first, second)
        if len(token_ids) > max_len:
            raise APIError(f"'{param}[{index}]' with its query has {len(token_ids)} tokens; this model takes at most "
                           f"{max_len}.", param=param, code="context_length_exceeded")
        requests.append(EngineCoreRequest(
            f"{request_id}-{index}", token_ids, EngineSamplingParams(), arrival_time=time.time(),
            pooling_params=PoolingParams("score"), token_type_ids=type_ids,
        ))
    scores = await _encoded(llm, requests, param)
    return [float(score[0]) for score in scores], sum(len(r.prompt_token_ids) for r in requests)


async def _cosines(llm: AsyncLLM, pairs: list[tuple[str, str]], param: str) -> tuple[list[float], int]:
    """The cosine of each pair's two vectors, each distinct text embedded once."""
    texts = list(dict.fromkeys(text for pair in pairs for text in pair))
    request_id, max_len = f"score-{uuid.uuid4().hex}", llm.ready.max_model_len
    requests = []
    for index, text in enumerate(texts):
        token_ids = llm.tokenizer.encode(text, add_special_tokens=True)
        if len(token_ids) > max_len:
            raise APIError(f"A text of '{param}' has {len(token_ids)} tokens; this model takes at most {max_len}.",
                           param=param, code="context_length_exceeded")
        requests.append(EngineCoreRequest(f"{request_id}-{index}", token_ids, EngineSamplingParams(),
                                          arrival_time=time.time(), pooling_params=PoolingParams("embed")))
    vectors = dict(zip(texts, await _encoded(llm, requests, param), strict=True))
    unit = {text: vector / max(float(np.linalg.norm(vector)), 1e-12) for text, vector in vectors.items()}
    return [float(unit[first] @ unit[second]) for first, second in pairs], sum(len(r.prompt_token_ids) for r in requests)


async def _encoded(llm: AsyncLLM, requests: list[EngineCoreRequest], param: str) -> list[np.ndarray]:
    try:
        return await llm.encode(requests)
    except EngineRequestError as exc:
        raise APIError(f"The texts could not be scored: {exc}.", param=param) from exc


async def rerank(llm: AsyncLLM, body: RerankRequest, model_name: str) -> dict[str, Any]:
    """The documents best first, each with its index in the body and its score; `top_n` of them where asked."""
    documents = body.texts()
    if not documents:
        raise APIError("'documents' is empty.", param="documents")
    scores, num_tokens = await pair_scores(llm, [(body.query, document) for document in documents], "documents")
    order = sorted(range(len(documents)), key=lambda index: -scores[index])
    results = [
        {"index": index, "relevance_score": scores[index], **({"document": {"text": documents[index]}}
                                                              if body.return_documents else {})}
        for index in order[: body.top_n or None]
    ]
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model_name, "usage": {"total_tokens": num_tokens},
            "results": results}


async def score(llm: AsyncLLM, body: ScoreRequest, model_name: str) -> dict[str, Any]:
    """Each pair's score, in the body's order."""
    scores, num_tokens = await pair_scores(llm, body.pairs(), "text_2")
    return {
        "id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()), "model": model_name,
        "data": [{"index": index, "object": "score", "score": value} for index, value in enumerate(scores)],
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }
