"""Hostile input on the gateway's sockets: 10,000 garbage and mutated frames, half on the socket
engines register and beat on, half on the one their outputs arrive on, next to a real engine
process (tiny random model); the gateway keeps its engine and serves the same tokens after."""

from __future__ import annotations

import asyncio
import logging
import os
import random
from pathlib import Path

import pytest
import zmq

from proto.codec import MsgpackEncoder
from proto.engine_config import EngineConfig
from proto.engine_input import EngineCoreRequest, SamplingParams
from proto.engine_output import ENGINE_CORE_DEAD, EngineCoreOutput, EngineCoreOutputs, FinishReason, UtilityResult
from proto.handshake import EngineMessageType, EngineReady
from service.client.async_mp_client import AsyncMPClient

NUM_FRAMES = 10_000


def engine_messages() -> list[list[bytes]]:
    """What engines send on the gateway's ROUTER: a registration of a model this gateway does not
    serve, heartbeats, draining and goodbye notices."""
    encoded = [bytes(f) for f in MsgpackEncoder().encode(EngineReady(engine_index=5, model_name="other", max_model_len=64))]
    return [
        [EngineMessageType.READY.value, *encoded],
        [EngineMessageType.DRAINING.value],
        [EngineMessageType.GOODBYE.value],
    ]


def output_messages() -> list[list[bytes]]:
    """What engines push: outputs of requests nobody sent, an answer to a call nobody made."""
    encoder = MsgpackEncoder()
    outputs = [
        EngineCoreOutputs(engine_index=0, outputs=[EngineCoreOutput("nobody", [5, 6], FinishReason.LENGTH)]),
        EngineCoreOutputs(engine_index=0, utility_output=UtilityResult(12345, result=[1])),
    ]
    return [[bytes(f) for f in encoder.encode(message)] for message in outputs]


def mutated(rng: random.Random, messages: list[list[bytes]]) -> list[bytes]:
    """A valid message replayed, bit-flipped, truncated, extended, split, or plain noise."""
    frames = list(rng.choice(messages))
    kind = rng.randrange(6)
    if kind == 0:
        return frames
    index = rng.randrange(len(frames))
    frame = bytearray(frames[index])
    if kind == 1 and frame:
        for _ in range(rng.randint(1, 8)):
            frame[rng.randrange(len(frame))] = rng.randrange(256)
    elif kind == 2:
        frame = frame[: rng.randrange(len(frame) + 1)]
    elif kind == 3:
        frame += rng.randbytes(rng.randint(1, 64))
    elif kind == 4:
        return [*frames, *(rng.randbytes(rng.randint(0, 8)) for _ in range(rng.randint(1, 3)))]
    else:
        return [rng.randbytes(rng.randint(0, 16)) for _ in range(rng.randint(1, 4))]
    frames[index] = bytes(frame)
    return frames


async def greedy_tokens(client: AsyncMPClient, request_id: str) -> list[int]:
    await client.add_request_async(EngineCoreRequest(
        request_id, list(range(200, 230)), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    ))
    tokens: list[int] = []
    while True:
        outputs = await asyncio.wait_for(client.get_output_async(), 30)
        assert isinstance(outputs, EngineCoreOutputs)
        for output in outputs.outputs:
            if output.request_id == request_id:
                tokens += output.new_token_ids
                if output.is_finished:
                    return tokens


@pytest.mark.slow
async def test_ten_thousand_garbage_and_mutated_frames_leave_the_gateway_serving(
    tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR)  # NOTE: each dropped message logs a warning
    client = AsyncMPClient(EngineConfig(
        model_path=str(tiny_model_dir), model_name="tiny", kv_cache_memory_gib=0.05, max_model_len=1024,
        num_threads=1,
    ))
    ctx = zmq.Context()
    try:
        await client.wait_ready()
        before = await greedy_tokens(client, "before")
        rng = random.Random(0)
        # NOTE: peers of their own, as a stranger on the machine would connect.
        router_peers = [ctx.socket(zmq.DEALER) for _ in range(4)]
        for peer in router_peers:
            peer.setsockopt(zmq.IDENTITY, os.urandom(8))
            peer.connect(client.input_address)
        pusher = ctx.socket(zmq.PUSH)
        pusher.connect(client.output_address)
        dead_notices = [[ENGINE_CORE_DEAD, bytes([index])] for index in range(1, 256)]  # no such engine
        engine_side, output_side = engine_messages(), output_messages()
        for i in range(NUM_FRAMES // 2):
            rng.choice(router_peers).send_multipart(mutated(rng, engine_side))
            frames = rng.choice(dead_notices) if i % 50 == 0 else mutated(rng, output_side)
            pusher.send_multipart(frames)
            if i % 200 == 0:
                await asyncio.sleep(0)  # NOTE: lets the gateway's socket tasks keep up
        await asyncio.sleep(1.0)
        assert [engine.index for engine in client.alive_engines] == [0]
        assert await greedy_tokens(client, "after") == before
        for peer in [*router_peers, pusher]:
            peer.close(linger=0)
    finally:
        client.shutdown()
        ctx.term()
