"""Admission and API keys without a model: what is refused in each phase, and how a guarded
stream ends on its timeout or at the end of a drain."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import pytest
from starlette.testclient import TestClient

from service.api.admission import Admission, Phase
from service.api.app import create_app
from service.api.routes import path_rules
from service.frontend.outputs import CompletionOutput, RequestOutput
from service.openai.errors import APIError


def output(request_id: str, finish_reason: str | None = None) -> RequestOutput:
    completion = CompletionOutput(0, "x", [1], finish_reason=finish_reason)
    return RequestOutput(request_id, None, [1], [completion], finished=finish_reason is not None)


class HangingStream:
    """Choice 0 finishes at once; choice 1 says one token, then waits forever."""

    def __init__(self) -> None:
        self.is_closed = False

    async def outputs(self) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        try:
            yield 0, output("r-0", "length")
            yield 1, output("r-1")
            await asyncio.Event().wait()
        finally:
            self.is_closed = True


async def drain(stream: AsyncGenerator[tuple[int, RequestOutput], None]) -> tuple[dict[int, str | None], APIError]:
    finish_reasons: dict[int, str | None] = {}
    with pytest.raises(APIError) as error:
        async for index, delta in stream:
            finish_reasons[index] = delta.outputs[0].finish_reason
    return finish_reasons, error.value


async def test_past_its_timeout_a_stream_ends_unfinished_choices_with_abort_then_raises_408() -> None:
    admission = Admission(request_timeout_s=0.05)
    inner = HangingStream()
    finish_reasons, error = await asyncio.wait_for(drain(admission.guard(inner.outputs(), 2)), 60)
    assert finish_reasons == {0: "length", 1: "abort"}
    assert (error.status_code, error.error_type, error.code) == (408, "timeout_error", "request_timeout")
    assert inner.is_closed


async def test_the_end_of_a_drain_ends_waiting_streams_and_later_ones_at_once() -> None:
    admission = Admission()
    inner = HangingStream()
    waiting = asyncio.create_task(drain(admission.guard(inner.outputs(), 2)))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    admission.abort_all()
    finish_reasons, error = await asyncio.wait_for(waiting, 5)
    assert finish_reasons == {0: "length", 1: "abort"}
    assert (error.status_code, error.code) == (503, "server_shutting_down")
    assert inner.is_closed
    later = HangingStream()
    assert (await asyncio.wait_for(drain(admission.guard(later.outputs(), 1)), 60))[0] == {0: "abort"}


def test_each_phase_refuses_what_it_should() -> None:
    admission, rules = Admission(max_num_in_flight=1), path_rules()
    assert admission.refusal("/health", rules) is None and admission.refusal("/version", rules) is None
    assert admission.refusal("/static/playground.js", rules) is None
    for path in ("/v1/models", "/v1/completions", "/metrics"):
        refusal = admission.refusal(path, rules)
        assert refusal is not None and refusal.status_code == 503
    admission.phase = Phase.SERVING
    assert admission.refusal("/v1/completions", rules) is None
    admission.acquire()
    busy = admission.refusal("/v1/chat/completions", rules)
    assert busy is not None and busy.status_code == 429 and busy.headers["Retry-After"] == "1"
    assert admission.refusal("/v1/models", rules) is None
    admission.release()
    admission.phase = Phase.DRAINING
    assert admission.refusal("/metrics", rules) is None
    draining = admission.refusal("/v1/models", rules)
    assert draining is not None and draining.status_code == 503


def test_a_head_past_the_cap_gets_431_on_any_route() -> None:
    admission = Admission(max_header_bytes=100)
    assert admission.refusal("/health", path_rules(), 100) is None
    too_large = admission.refusal("/health", path_rules(), 101)
    assert too_large is not None and too_large.status_code == 431


@pytest.mark.parametrize(
    ("path", "authorization", "status"),
    [
        ("/health", None, 503),  # open, and still loading
        ("/metrics", None, 503),
        ("/v1/models", None, 401),
        ("/v1/models", "Bearer wrong", 401),
        ("/v1/models", "Basic k1", 401),
        ("/v1/models", "k1", 401),
        ("/v1/models", "Bearer k1", 503),  # let in, and still loading
        ("/v1/models", "bearer  k2 ", 503),
        ("/nowhere", None, 401),
    ],
)
def test_api_keys_come_before_everything_but_open_routes(path: str, authorization: str | None, status: int) -> None:
    app = create_app(None, api_keys=["k1", "k2"])
    headers = {} if authorization is None else {"Authorization": authorization}
    with TestClient(app) as client:
        response = client.get(path, headers=headers)
    assert response.status_code == status
    if status == 401:
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["WWW-Authenticate"] == "Bearer"


def test_metrics_auth_closes_metrics_too() -> None:
    with TestClient(create_app(None, api_keys=["k1"], is_metrics_auth=True)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/health").status_code == 503


async def test_a_drain_ending_as_a_request_times_out_ends_it_once() -> None:
    admission = Admission(request_timeout_s=60)
    waiting = asyncio.create_task(drain(admission.guard(HangingStream().outputs(), 2)))
    await asyncio.sleep(0.05)
    (timeout,) = admission._timeouts
    timeout._on_timeout()  # NOTE: the timeout fires, and the drain ends before the stream sees it.
    admission.abort_all()
    finish_reasons, error = await asyncio.wait_for(waiting, 5)
    assert finish_reasons == {0: "length", 1: "abort"}
    assert error.status_code in (408, 503)
