"""POST /tokenize and POST /detokenize, as vLLM has them."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.errors import parse_body
from service.api.server_state import ServerState
from service.openai.errors import APIError
from service.openai.protocol import ChatMessage, OpenAIModel


class TokenizeRequest(OpenAIModel):
    """A text prompt, or chat messages rendered by the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(OpenAIModel):
    """Token ids to turn back into text."""

    model: str | None = None
    tokens: list[int]


async def tokenize(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, TokenizeRequest, state.max_request_body_bytes)
    state.model_name(body.model)
    tokenizer = state.llm.tokenizer
    if body.messages is not None:
        try:
            token_ids = state.llm.input_processor.chat_prompt(
                [m.to_template_dict() for m in body.messages],
                add_generation_prompt=body.add_generation_prompt,
                **(body.chat_template_kwargs or {}),
            ).token_ids
        except Exception as exc:
            raise APIError(f"The messages could not be rendered: {exc}", param="messages") from exc
    elif body.prompt is not None:
        token_ids = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
    else:
        raise APIError("Give either 'prompt' or 'messages'.", param="prompt")
    token_strs = [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids] if body.return_token_strs else None
    return JSONResponse({
        "count": len(token_ids),
        "max_model_len": state.llm.ready.max_model_len,
        "tokens": token_ids,
        "token_strs": token_strs,
    })


async def detokenize(request: Request) -> Response:
    state: ServerState = request.app.state.server
    body = await parse_body(request, DetokenizeRequest, state.max_request_body_bytes)
    state.model_name(body.model)
    vocab_size = state.llm.input_processor.vocab_size
    if any(not 0 <= t < vocab_size for t in body.tokens):
        raise APIError(f"Token ids must be in [0, {vocab_size}).", param="tokens")
    return JSONResponse({"prompt": state.llm.tokenizer.decode(body.tokens)})
