"""The codec: typed round trips, inline and out-of-band arrays, no copies on receive."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import ormsgpack
import pytest
import torch
import zmq

from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_input import EngineCoreRequest, SamplingParams, UtilityCall
from proto.engine_output import EngineCoreOutput, EngineCoreOutputs, FinishReason, SchedulerStats, UtilityResult
from proto.handshake import PROTOCOL_VERSION, EngineReady
from proto.sockets import new_ipc_address


def roundtrip(obj: object, target: object) -> object:
    return MsgpackDecoder(target).decode(MsgpackEncoder().encode(obj))


def test_request_roundtrip_keeps_types() -> None:
    request = EngineCoreRequest(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3],
        sampling_params=SamplingParams(temperature=0.5, top_k=4, seed=7, stop_token_ids=[9]),
        arrival_time=12.5,
        priority=-1,
    )
    decoded = roundtrip(request, EngineCoreRequest)
    assert decoded == request
    assert isinstance(decoded.sampling_params, SamplingParams)


def test_outputs_roundtrip_with_enums_and_nested_lists() -> None:
    outputs = EngineCoreOutputs(
        engine_index=1,
        outputs=[
            EngineCoreOutput("a", [5], None),
            EngineCoreOutput("b", [6, 7], FinishReason.LENGTH, stop_reason="x"),
        ],
        timestamp=3.0,
        utility_output=UtilityResult(4, result={"k": [1, 2]}),
    )
    decoded = roundtrip(outputs, EngineCoreOutputs)
    assert decoded == outputs
    assert decoded.outputs[1].finish_reason is FinishReason.LENGTH
    assert str(decoded.outputs[1].finish_reason) == "length"


def test_a_peer_one_field_apart_still_decodes() -> None:
    decoder = MsgpackDecoder(EngineCoreOutputs)
    # NOTE: a newer peer's extra field is ignored; an older peer's missing ones take their defaults.
    message = {"outputs": [{"request_id": "a", "new_token_ids": [5], "finish_reason": 1, "added_later": 3}]}
    decoded = decoder.decode(ormsgpack.packb(message))
    assert decoded.outputs == [EngineCoreOutput("a", [5], FinishReason.LENGTH)]
    assert decoded.engine_index == 0 and decoded.scheduler_stats is None
    with pytest.raises(KeyError, match="request_id"):
        decoder.decode(ormsgpack.packb({"outputs": [{"new_token_ids": [5]}]}))


def test_abort_and_utility_and_ready_roundtrip() -> None:
    assert roundtrip(["a", "b"], list[str]) == ["a", "b"]
    call = UtilityCall(call_id=3, method="get_stats", args=[1, "x"])
    assert roundtrip(call, UtilityCall) == call
    ready = roundtrip(EngineReady(engine_index=2, eos_token_ids=[2]), EngineReady)
    assert ready.protocol_version == PROTOCOL_VERSION and ready.eos_token_ids == [2]


def test_a_utility_result_comes_back_as_its_type() -> None:
    stats = SchedulerStats(num_running_reqs=2, kv_cache_usage=0.5, num_prefix_cache_queries=8,
                           num_prefix_cache_hits=2, num_free_blocks=7)
    outputs = roundtrip(EngineCoreOutputs(utility_output=UtilityResult(4, result=stats)), EngineCoreOutputs)
    assert isinstance(outputs, EngineCoreOutputs) and outputs.utility_output is not None
    decoded = MsgpackDecoder(SchedulerStats).convert(outputs.utility_output.result)
    assert decoded == stats and decoded.prefix_cache_hit_rate == 0.25
    with pytest.raises(TypeError, match="SchedulerStats"):
        MsgpackDecoder(SchedulerStats).convert(["not", "stats"])


def test_small_array_travels_inline() -> None:
    frames = MsgpackEncoder().encode({"a": np.arange(4, dtype=np.int32)})
    assert len(frames) == 1
    decoded = MsgpackDecoder(dict[str, np.ndarray]).decode(frames)
    np.testing.assert_array_equal(decoded["a"], np.arange(4, dtype=np.int32))


def test_large_array_and_tensor_travel_out_of_band() -> None:
    big = np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32)
    tensor = torch.arange(1000, dtype=torch.int64)
    frames = MsgpackEncoder().encode({"big": big, "t": tensor})
    assert len(frames) == 3
    assert max(len(f) for f in frames[:1]) < 200  # the main frame holds only headers
    decoded = MsgpackDecoder(dict[str, np.ndarray]).decode(frames)
    np.testing.assert_array_equal(decoded["big"], big)
    np.testing.assert_array_equal(decoded["t"], tensor.numpy())


def test_encode_into_reuses_the_callers_buffer() -> None:
    buf = bytearray(b"old contents that are longer than the message")
    frames = MsgpackEncoder().encode_into(EngineCoreOutput("r", [1]), buf)
    assert frames[0] is buf
    assert MsgpackDecoder(EngineCoreOutput).decode(frames) == EngineCoreOutput("r", [1])


def test_unknown_type_is_refused_not_pickled() -> None:
    with pytest.raises(TypeError):
        MsgpackEncoder().encode({"x": object()})


def test_oob_array_is_received_without_a_copy(tmp_path: Path) -> None:
    """Over real ZeroMQ sockets, the decoded array is a view of the received frame."""
    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    try:
        address = new_ipc_address(str(tmp_path))
        pull.bind(address)
        push.connect(address)
        big = np.arange(100_000, dtype=np.float32)
        push.send_multipart(MsgpackEncoder().encode({"x": big}), copy=False)
        assert pull.poll(5000)
        frames = pull.recv_multipart(copy=False)
        decoded = MsgpackDecoder(dict[str, np.ndarray]).decode(frames)["x"]
        np.testing.assert_array_equal(decoded, big)
        assert not decoded.flags.owndata
        frame_memory = np.frombuffer(frames[1].buffer, dtype=np.uint8)
        assert np.shares_memory(decoded, frame_memory)
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


@pytest.mark.parametrize(("target", "raw"), [
    (list[str], 5),  # an abort that is not a list
    (list[str], [1, 2]),
    (EngineCoreRequest, [1, 2]),  # a list where a map belongs
    (EngineCoreRequest, {"request_id": 7, "prompt_token_ids": [1], "sampling_params": {}}),
    (EngineCoreRequest, {"request_id": "a", "prompt_token_ids": [1, "2"], "sampling_params": {}}),
    (EngineCoreRequest, {"request_id": "a", "prompt_token_ids": [1], "sampling_params": {"temperature": "hot"}}),
    (EngineCoreOutputs, {"outputs": [{"request_id": "a", "new_token_ids": 3}]}),
])
def test_data_of_another_shape_is_a_type_error_not_a_message(target: object, raw: object) -> None:
    with pytest.raises(TypeError):
        MsgpackDecoder(target).decode(ormsgpack.packb(raw))


def test_ints_stand_for_floats_and_none_for_optional_fields() -> None:
    raw = {"request_id": "a", "prompt_token_ids": [1], "sampling_params": {"temperature": 1, "top_k": None, "logit_bias": [[5, 2]]}}
    request = MsgpackDecoder(EngineCoreRequest).decode(ormsgpack.packb(raw))
    assert request.sampling_params.temperature == 1 and request.sampling_params.top_k is None
    assert request.sampling_params.logit_bias == [(5, 2)]
