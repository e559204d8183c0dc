"""POST /tokenize and POST /detokenize, as vLLM has them."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.errors import parse_body
from service.api.gateway_state import ServerState, server_state
from service.openai.errors import APIError
from service.openai.protocol import ChatMessage, OpenAIModel


class TokenizeRequest(OpenAIModel):
    """A text prompt, or chat messages rendered by the chat template (vLLM's two tokenize bodies)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    # NOTE: vLLM's defaults: BOS/EOS for a text prompt, none on top of a chat template's.
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None

    def check_supported(self) -> None:
        self.check_refused("tokenize_chat" if self.messages is not None else "tokenize_completion")
        if self.continue_final_message and self.add_generation_prompt:
            raise APIError("'continue_final_message' needs 'add_generation_prompt' set to false.",
                           param="continue_final_message")


class DetokenizeRequest(OpenAIModel):
    """Token ids to turn back into text."""

    model: str | None = None
    tokens: list[int]


async def tokenize(request: Request) -> Response:
    state: ServerState = server_state(request)
    body = await parse_body(request, TokenizeRequest, state.max_request_body_bytes)
    state.preparer.model_name(body.model)
    body.check_supported()
    tokenizer = state.llm.tokenizer
    if body.messages is not None:
        template_kwargs = {**(body.chat_template_kwargs or {})}
        if body.tools:
            template_kwargs.setdefault("tools", body.tools)
        try:
            token_ids = state.llm.input_processor.chat_prompt(
                [m.to_template_dict() for m in body.messages],
                add_generation_prompt=body.add_generation_prompt,
                continue_final_message=body.continue_final_message,
                add_special_tokens=bool(body.add_special_tokens),
                **template_kwargs,
            ).token_ids
        except Exception as exc:
            raise APIError(f"The messages could not be rendered: {exc}", param="messages") from exc
    elif body.prompt is not None:
        token_ids = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens is not False)
    else:
        raise APIError("Give either 'prompt' or 'messages'.", param="prompt")
    # NOTE: vocabulary tokens as vLLM returns them ("Ġis"), not their decoded text (" is").
    token_strs = [tokenizer.backend.id_to_token(t) for t in token_ids] if body.return_token_strs else None
    return JSONResponse({
        "count": len(token_ids),
        "max_model_len": state.llm.ready.max_model_len,
        "tokens": token_ids,
        "token_strs": token_strs,
    })


async def detokenize(request: Request) -> Response:
    state: ServerState = server_state(request)
    body = await parse_body(request, DetokenizeRequest, state.max_request_body_bytes)
    state.preparer.model_name(body.model)
    vocab_size = state.llm.input_processor.vocab_size
    if any(not 0 <= t < vocab_size for t in body.tokens):
        raise APIError(f"Token ids must be in [0, {vocab_size}).", param="tokens")
    return JSONResponse({"prompt": state.llm.tokenizer.decode(body.tokens)})
