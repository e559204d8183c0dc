"""POST /v1/completions: one prompt or many (text or token ids), n choices each."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.api.admission import Admission
from service.api.disconnect import unless_disconnected
from service.api.errors import parse_body
from service.api.gateway_state import ServerState, server_state
from service.api.sse import sse_response
from service.frontend.outputs import collect
from service.openai.prepare import Preparer
from service.openai.protocol import CompletionRequest
from service.openai.response_bodies import CompletionResponse


async def create_completion(request: Request) -> Response:
    """In order (a re-sent request resumes its stream instead: `resumable`): the body is read, prepared
    once (prompts, SamplingParams, engine requests, ids), every sample of every prompt is sent to
    the engine, and the answer goes back whole or as a stream."""
    state: ServerState = server_state(request)
    preparer: Preparer = state.preparer
    admission: Admission = state.admission
    body = await parse_body(request, CompletionRequest, state.max_request_body_bytes)
    prepared = await preparer.prepare(body)
    engine_outputs = state.llm.generate(prepared.engine_requests, prepared.params)
    outputs = await admission.guarded(engine_outputs, prepared)
    response = CompletionResponse(prepared, body, state.llm.tokenizer)
    if body.stream:
        return sse_response(request, state.gateway, response.chunks(outputs), prepared.response_id)
    whole = await unless_disconnected(request, collect(outputs, len(prepared.prompts), body.n))
    return JSONResponse(response.whole(whole))
