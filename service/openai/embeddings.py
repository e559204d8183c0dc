"""OpenAI's embeddings: the body of POST /v1/embeddings, its inputs as the engine's pooling requests, and
the list of vectors it answers (floats, or base64 of little-endian float32 as the OpenAI SDK asks by default)."""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any, Literal

import numpy as np
from pydantic import Field

from proto.engine_input import EngineCoreRequest, PoolingParams
from proto.engine_input import SamplingParams as EngineSamplingParams
from service.frontend.async_llm import AsyncLLM, EngineRequestError
from service.model_files.tokenizer import Tokenizer
from service.openai.errors import APIError
from service.openai.protocol import OpenAIModel

MAX_INPUTS = 2048  # OpenAI's cap on one request's inputs


class EmbeddingRequest(OpenAIModel):
    """What to embed: a text, texts, a list of token ids, or lists of them; how the vectors come back."""

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    # NOTE: vLLM's: keep each input's first tokens up to this many (-1: as many as the model takes); unset, an
    # input longer than the model takes is a 400.
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)

    def token_ids(self, tokenizer: Tokenizer, max_model_len: int) -> list[list[int]]:
        """Each input's token ids (texts with the model's special tokens, as it was trained), cut to
        `truncate_prompt_tokens` where it is set; a 400 naming `input` for none, too many, an empty one, or one
        longer than the model takes."""
        inputs: list[Any] = [self.input] if isinstance(self.input, str) else list(self.input)
        if inputs and all(isinstance(item, int) for item in inputs):
            inputs = [inputs]
        if not inputs:
            raise APIError("'input' is empty: give a text, texts, or token ids.", param="input")
        if len(inputs) > MAX_INPUTS:
            raise APIError(f"'input' has {len(inputs)} items; at most {MAX_INPUTS} a request.", param="input")
        limit = self.truncate_prompt_tokens
        if limit == 0:
            raise APIError("'truncate_prompt_tokens' must be a count of tokens to keep, or -1.",
                           param="truncate_prompt_tokens")
        if limit is not None and (limit == -1 or limit > max_model_len):
            limit = max_model_len
        token_ids = []
        for index, item in enumerate(inputs):
            if isinstance(item, str):
                ids = tokenizer.encode(item, add_special_tokens=True) if limit is None else tokenizer.encode_truncated(item, limit)
            else:
                ids = list(item) if limit is None else list(item)[:limit]
            where = "'input'" if isinstance(self.input, str) or len(inputs) == 1 else f"'input[{index}]'"
            if not ids or (isinstance(item, str) and not item):
                raise APIError(f"{where} is empty.", param="input")
            if len(ids) > max_model_len:
                raise APIError(f"{where} has {len(ids)} tokens; this model takes at most {max_model_len} "
                               "('truncate_prompt_tokens' cuts an input to fit).",
                               param="input", code="context_length_exceeded")
            token_ids.append(ids)
        return token_ids


async def create_embeddings(llm: AsyncLLM, body: EmbeddingRequest, model_name: str) -> dict[str, Any]:
    """The body's inputs embedded in the engine, in OpenAI's list shape with the tokens they took."""
    token_ids = body.token_ids(llm.tokenizer, llm.ready.max_model_len)
    request_id = f"embd-{uuid.uuid4().hex}"
    params = PoolingParams("embed", body.dimensions)
    requests = [
        EngineCoreRequest(f"{request_id}-{index}", ids, EngineSamplingParams(), arrival_time=time.time(),
                          pooling_params=params)
        for index, ids in enumerate(token_ids)
    ]
    try:
        vectors = await llm.encode(requests)
    except EngineRequestError as exc:
        raise APIError(f"The input could not be embedded: {exc}.", param="input") from exc
    data = [{"object": "embedding", "index": index, "embedding": _encoded(vector, body.encoding_format)}
            for index, vector in enumerate(vectors)]
    num_tokens = sum(len(ids) for ids in token_ids)
    return {
        "id": request_id, "object": "list", "created": int(time.time()), "model": model_name, "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


def _encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    floats: list[float] = vector.astype(np.float32).tolist()
    return floats
