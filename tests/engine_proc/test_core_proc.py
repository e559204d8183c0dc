"""The engine's two socket threads and busy loop, against a fake core, over real ZeroMQ sockets."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_proc.core_proc import EngineCoreProc
from proto.codec import MsgpackDecoder
from proto.engine_input import EngineCoreRequest, RequestType, SamplingParams, UtilityCall
from proto.engine_output import (
    ENGINE_CORE_DEAD,
    EngineCoreOutput,
    EngineCoreOutputs,
    FinishReason,
    SchedulerStats,
    UtilityResult,
)
from proto.handshake import PROTOCOL_VERSION, EngineReady
from proto.sockets import engine_identity
from tests.engine_proc.gateway_side import Gateway, recv_ready


class FakeCore:
    """Emits one token per step per request: the prompt's tokens in reverse, then stops."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.pending: dict[str, list[int]] = {}
        self.fail_on = fail_on
        self.suspect_request_ids: list[str] = []

    @property
    def has_work(self) -> bool:
        return bool(self.pending)

    def ready_message(self) -> EngineReady:
        return EngineReady(engine_index=3, model_name="fake", max_model_len=64)

    def set_engine_index(self, engine_index: int) -> None:
        assert engine_index == 3

    def add_request(self, request: EngineCoreRequest) -> None:
        if request.request_id == self.fail_on:
            self.suspect_request_ids = [request.request_id]
            raise RuntimeError("the core broke")
        self.pending[request.request_id] = list(reversed(request.prompt_token_ids))

    def abort_requests(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.pending.pop(request_id, None)

    def step(self) -> EngineCoreOutputs:
        outputs = []
        for request_id, tokens in list(self.pending.items()):
            token = tokens.pop(0)
            finish = FinishReason.LENGTH if not tokens else None
            outputs.append(EngineCoreOutput(request_id, [token], finish))
            if not tokens:
                del self.pending[request_id]
        return EngineCoreOutputs(engine_index=3, outputs=outputs)

    def idle_outputs(self) -> EngineCoreOutputs:
        return EngineCoreOutputs(engine_index=3, outputs=[], scheduler_stats=SchedulerStats(num_running_reqs=0))

    def call_utility(self, call: UtilityCall) -> UtilityResult:
        return UtilityResult(call.call_id, result=[call.method, *call.args])


def start(core: FakeCore, gateway: Gateway) -> tuple[EngineCoreProc, threading.Thread, list[int]]:
    proc = EngineCoreProc(core, gateway.input_address, gateway.output_address)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(proc.run()), daemon=True)
    thread.start()
    return proc, thread, exit_codes


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path)
    yield gateway
    gateway.close()


def test_engine_registers_then_streams_outputs_and_answers_utilities(gateway: Gateway) -> None:
    proc, thread, exit_codes = start(FakeCore(), gateway)
    ready = recv_ready(gateway)
    assert ready.protocol_version == PROTOCOL_VERSION and ready.model_name == "fake"

    gateway.send(RequestType.ADD, EngineCoreRequest("a", [1, 2, 3], SamplingParams()))
    tokens, finish = [], None
    while finish is None:
        for output in gateway.recv_outputs().outputs:
            tokens += output.new_token_ids
            finish = output.finish_reason
    assert tokens == [3, 2, 1] and finish is FinishReason.LENGTH

    gateway.send(RequestType.UTILITY, UtilityCall(7, "echo", [1, "x"]))
    result = gateway.recv_outputs().utility_output
    assert result is not None and result.call_id == 7 and result.result == ["echo", 1, "x"]

    proc.is_running = False
    thread.join(5)
    assert exit_codes == [0]


def test_abort_stops_a_request_between_steps(gateway: Gateway) -> None:
    core = FakeCore()
    proc, thread, _ = start(core, gateway)
    recv_ready(gateway)
    gateway.send(RequestType.ADD, EngineCoreRequest("long", list(range(100_000)), SamplingParams()))
    gateway.recv_outputs()
    gateway.send(RequestType.ABORT, ["long"])
    # Outputs already in flight may arrive, then the idle engine's stats (no step would report
    # the abort), then nothing more: the request is gone.
    received = []
    while gateway.pull.poll(300):
        received.append(gateway.decoder.decode(gateway.recv()))
    assert "long" not in core.pending
    last = received[-1]
    assert last.outputs == [] and last.scheduler_stats is not None and last.scheduler_stats.num_running_reqs == 0
    proc.is_running = False
    thread.join(5)


def test_undecodable_message_is_dropped_and_the_engine_keeps_going(gateway: Gateway) -> None:
    proc, thread, _ = start(FakeCore(), gateway)
    recv_ready(gateway)
    gateway.router.send_multipart([engine_identity(3), b"\x09", b"garbage"])
    gateway.router.send_multipart([engine_identity(3), RequestType.ADD.value, b"\xc1"])
    gateway.send(RequestType.ADD, EngineCoreRequest("ok", [5], SamplingParams()))
    assert gateway.recv_outputs().outputs[0].new_token_ids == [5]
    proc.is_running = False
    thread.join(5)


def test_fatal_error_sends_engine_core_dead_and_exits_non_zero(gateway: Gateway) -> None:
    _, thread, exit_codes = start(FakeCore(fail_on="boom"), gateway)
    recv_ready(gateway)
    gateway.send(RequestType.ADD, EngineCoreRequest("boom", [1], SamplingParams()))
    frames = gateway.recv()
    # its index (as its identity), then the request it was adding when it broke
    assert [f.bytes for f in frames[:2]] == [ENGINE_CORE_DEAD, engine_identity(3)]
    assert MsgpackDecoder(list[str]).decode(frames[2:]) == ["boom"]
    thread.join(10)
    assert exit_codes == [1]


def test_output_thread_reuses_buffers_once_sent(gateway: Gateway) -> None:
    proc, thread, _ = start(FakeCore(), gateway)
    recv_ready(gateway)
    for i in range(20):
        gateway.send(RequestType.ADD, EngineCoreRequest(f"r{i}", [1, 2], SamplingParams()))
    num_outputs = 0
    while num_outputs < 40:
        num_outputs += len(gateway.recv_outputs().outputs)
    proc.is_running = False
    thread.join(5)
    # Far fewer buffers than messages: each went back to the pool after its send completed.
    assert 1 <= len(proc.output_thread.free_buffers) < 10


def test_one_engine_serves_two_gateways_each_on_its_own_sockets(tmp_path: Path) -> None:
    first, second = Gateway(tmp_path), Gateway(tmp_path)
    try:
        proc = EngineCoreProc(
            FakeCore(), [first.input_address, second.input_address], [first.output_address, second.output_address]
        )
        thread = threading.Thread(target=proc.run, daemon=True)
        thread.start()
        recv_ready(first)
        recv_ready(second)
        first.send(RequestType.ADD, EngineCoreRequest("from-first", [1, 2], SamplingParams()))
        second.send(RequestType.ADD, EngineCoreRequest("from-second", [7, 8, 9], SamplingParams()))
        second.send(RequestType.UTILITY, UtilityCall(5, "ping"))
        for gateway, request_id, expected in ((first, "from-first", [2, 1]), (second, "from-second", [9, 8, 7])):
            tokens = []
            while len(tokens) < len(expected):
                outputs = gateway.recv_outputs()
                if outputs.utility_output is not None:
                    assert gateway is second and outputs.utility_output.result == ["ping"]
                    continue
                # A step of the other gateway's request still brings this one its stats, no outputs.
                assert {o.request_id for o in outputs.outputs} <= {request_id}
                tokens += [t for o in outputs.outputs for t in o.new_token_ids]
            assert tokens == expected
        proc.is_running = False
        thread.join(5)
    finally:
        first.close()
        second.close()
