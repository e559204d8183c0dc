"""Hostile input on the engine's sockets: 10,000 garbage and mutated frames over real ZeroMQ to an
engine with a real core (tiny random model); it keeps serving, and a real request afterwards gets
the tokens it got before."""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path

import pytest

from engine_proc.core import EngineCore
from engine_proc.core_proc import EngineCoreProc
from proto.codec import MsgpackEncoder
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, RequestType, SamplingParams, UtilityCall
from tests.engine_proc.gateway_side import Gateway, recv_ready

NUM_FRAMES = 10_000


def valid_messages(rng: random.Random) -> list[tuple[bytes, list[bytes]]]:
    """Well-formed messages of every kind the gateway sends, encoded as it encodes them."""
    encoder = MsgpackEncoder()
    messages = []
    for i in range(20):
        params = SamplingParams(
            temperature=rng.choice([0.0, 0.7, 1.5]), top_p=rng.choice([1.0, 0.5]), top_k=rng.choice([None, 5]),
            seed=rng.choice([None, i]), max_tokens=rng.randint(1, 6), num_logprobs=rng.choice([None, 2]),
            presence_penalty=rng.choice([0.0, 1.0]), stop_token_ids=rng.choice([[], [7]]),
        )
        prompt = [rng.randrange(1, 2000) for _ in range(rng.randint(1, 40))]
        messages.append((RequestType.ADD.value, [bytes(f) for f in encoder.encode(EngineCoreRequest(f"f{i}", prompt, params))]))
    messages.append((RequestType.ABORT.value, [bytes(f) for f in encoder.encode(["f1", "f2", "nobody"])]))
    messages.append((RequestType.UTILITY.value, [bytes(f) for f in encoder.encode(UtilityCall(9, "get_stats", []))]))
    messages.append((RequestType.UTILITY.value, [bytes(f) for f in encoder.encode(UtilityCall(10, "no_such_method", [1]))]))
    return messages


def mutated(rng: random.Random, messages: list[tuple[bytes, list[bytes]]]) -> list[bytes]:
    """One hostile message: a valid one replayed, bit-flipped, truncated, extended, retyped,
    split or joined, oversized, empty, or plain noise."""
    type_byte, frames = rng.choice(messages)
    payload = bytearray(b"".join(frames))
    kind = rng.randrange(9)
    if kind == 0:  # replayed as is (the same request id again)
        return [type_byte, *frames]
    if kind == 1:
        for _ in range(rng.randint(1, 8)):
            payload[rng.randrange(len(payload))] = rng.randrange(256)
    elif kind == 2:
        payload = payload[: rng.randrange(len(payload))]
    elif kind == 3:
        payload += rng.randbytes(rng.randint(1, 64))
    elif kind == 4:
        type_byte = rng.choice([bytes([rng.randrange(256)]), b"", b"\x00\x00", RequestType.HANDSHAKE.value])
    elif kind == 5:
        return [type_byte, *(bytes(payload[i : i + 3]) for i in range(0, len(payload), 3))]
    elif kind == 6:
        payload = bytearray(rng.randbytes(rng.choice([1 << 16, 1 << 20])))
    elif kind == 7:
        return [type_byte] if rng.random() < 0.5 else []
    else:
        return [rng.randbytes(rng.randint(0, 3)) for _ in range(rng.randint(1, 4))]
    return [type_byte, bytes(payload)]


def generate(gateway: Gateway, request_id: str, prompt: list[int]) -> list[int]:
    """A greedy request's tokens, other requests' outputs skipped."""
    gateway.send(RequestType.ADD, EngineCoreRequest(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)))
    tokens: list[int] = []
    while True:
        for output in gateway.recv_outputs().outputs:
            if output.request_id == request_id:
                tokens += output.new_token_ids
                if output.finish_reason is not None:
                    return tokens


@pytest.mark.slow
def test_ten_thousand_garbage_and_mutated_frames_leave_the_engine_serving(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.CRITICAL)  # NOTE: each dropped message logs its traceback
    gateway = Gateway(tmp_path, engine_index=0)
    core = EngineCore(EngineConfig(model_path=str(tiny_model_dir), kv_cache_memory_gib=0.05))
    proc = EngineCoreProc(core, gateway.input_address, gateway.output_address)
    exit_codes: list[int] = []
    thread = threading.Thread(target=lambda: exit_codes.append(proc.run()), daemon=True)
    thread.start()
    try:
        recv_ready(gateway)
        prompt = list(range(300, 340))
        before = generate(gateway, "before", prompt)
        rng = random.Random(0)
        messages = valid_messages(rng)
        for i in range(NUM_FRAMES):
            gateway.router.send_multipart([gateway.identity, *mutated(rng, messages)])
            if i % 500 == 0:  # NOTE: drain what the valid ones produced, so no queue fills
                while gateway.pull.poll(0):
                    gateway.recv()
        assert thread.is_alive() and not exit_codes
        assert generate(gateway, "after", prompt) == before
        assert thread.is_alive()
    finally:
        proc.is_running = False
        thread.join(10)
        gateway.close()
