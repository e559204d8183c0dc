"""The README's promise, with default flags, on the real default model: each of 16 greedy and 16 seeded
chat requests gets the same tokens alone, beside 15 others, beside 63 others (prompts prefilled beside
decodes), from the prefix cache, with n-gram drafts (greedy), and through a real server whose engine is
SIGKILLed twice mid-stream (each stream resumed on a restarted engine by prefilling its prompt and the
tokens it had)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from service import LLM, SamplingParams
from service.frontend.outputs import RequestOutput
from tests.server_process import kill_engines, running_server, wait_healthy

TOPICS = [
    "the Roman empire", "the sea", "airplanes", "machine learning", "photosynthesis", "cooking rice", "the sky",
    "cats", "volcanoes", "the moon", "bicycles", "coffee", "chess", "rainbows", "bees", "libraries",
]
TARGETS = [[{"role": "user", "content": f"Tell me something interesting about {topic}."}] for topic in TOPICS * 2]
OTHERS = [[{"role": "user", "content": f"Write a short poem about {topic}, please."}] for topic in TOPICS * 2]
MAX_TOKENS = 32
NUM_GREEDY = 16


def target_params(index: int) -> SamplingParams:
    """The first 16 targets decode greedily, the other 16 sample with their own seeds; every other one
    asks for its tokens' logprobs, whose bits show any change in its logits, where its tokens show
    only those that flip a pick."""
    num_logprobs = 1 if index % 2 else None
    if index < NUM_GREEDY:
        return SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, num_logprobs=num_logprobs)
    return SamplingParams(
        temperature=0.8, top_p=0.95, top_k=50, seed=1000 + index, max_tokens=MAX_TOKENS, ignore_eos=True,
        num_logprobs=num_logprobs,
    )


def other_params(index: int) -> SamplingParams:
    return SamplingParams(temperature=1.0, seed=index, max_tokens=MAX_TOKENS + index % 5, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(default_model_path: Path) -> Iterator[LLM]:
    """The default model in process with default flags (the engine's arithmetic is the server's)."""
    with LLM(str(default_model_path), multiprocess_mode=False) as llm:
        invariance = llm.llm_engine.engine_core.ready.kernel_choices["batch invariant"]
        if invariance != "yes":
            pytest.skip(f"this machine has no batch-invariant path: {invariance}")
        yield llm


@pytest.fixture(scope="module")
def alone(llm: LLM) -> list[RequestOutput]:
    """Each target on its own, from an empty prefix cache."""
    outputs = []
    for index, messages in enumerate(TARGETS):
        llm.reset_prefix_cache()
        outputs += llm.chat([messages], target_params(index), use_tqdm=False)
    assert all(len(output.outputs[0].token_ids) == MAX_TOKENS for output in outputs)
    return outputs


def token_ids(outputs: list[RequestOutput]) -> list[tuple[list[int], list[list[float]] | None]]:
    """Each output's tokens, and their logprobs where asked (compared bit for bit)."""
    return [
        (list(sample.token_ids), None if sample.logprobs is None else sample.logprobs.logprobs)
        for sample in (output.outputs[0] for output in outputs)
    ]


def test_each_request_gets_its_tokens_alone_beside_15_or_63_others_and_from_the_prefix_cache(
    llm: LLM, alone: list[RequestOutput]
) -> None:
    expected = token_ids(alone)
    greedy, seeded = range(NUM_GREEDY), range(NUM_GREEDY, len(TARGETS))
    # Beside 15 others: the 16 greedy ones together, then the 16 seeded ones; their prompts' blocks cached by now.
    for rows in (greedy, seeded):
        batch = llm.chat([TARGETS[i] for i in rows], [target_params(i) for i in rows], use_tqdm=False)
        assert all(output.num_cached_tokens > 0 for output in batch)
        assert token_ids(batch) == [expected[i] for i in rows]
    # Beside 63 others, from an empty cache: prompts prefilled in chunks beside other rows' decodes.
    llm.reset_prefix_cache()
    params = [target_params(i) for i in range(len(TARGETS))] + [other_params(i) for i in range(len(OTHERS))]
    batch = llm.chat([*TARGETS, *OTHERS], params, use_tqdm=False)[: len(TARGETS)]
    assert all(output.num_cached_tokens == 0 for output in batch[:1])
    assert token_ids(batch) == expected
    # Half of them beside others' longer prompts, each after its own cached prefix.
    rows = [*range(0, 32, 2)]
    params = [target_params(i) for i in rows] + [other_params(i) for i in range(8)]
    batch = llm.chat([*(TARGETS[i] for i in rows), *OTHERS[:8]], params, use_tqdm=False)[: len(rows)]
    assert all(output.num_cached_tokens > 0 for output in batch)
    assert token_ids(batch) == [expected[i] for i in rows]


def test_n_gram_drafts_leave_each_greedy_request_its_tokens(default_model_path: Path, alone: list[RequestOutput]) -> None:
    # NOTE: a drafted token is scored as a row of the step's forward, as it would be alone a step later.
    spec = {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_max": 4}
    with LLM(str(default_model_path), multiprocess_mode=False, kv_cache_memory_gib=0.25, speculative_config=spec) as llm:
        rows = range(NUM_GREEDY)
        drafted = llm.chat([TARGETS[i] for i in rows], [target_params(i) for i in rows], use_tqdm=False)
        assert llm.get_stats().num_accepted_tokens > 0
    assert token_ids(drafted) == token_ids(alone[:NUM_GREEDY])


async def stream_text(client: openai.AsyncOpenAI, index: int) -> str:
    params = target_params(index)
    extra = {"ignore_eos": True} if params.seed is None else {"ignore_eos": True, "top_k": params.top_k}
    stream = await client.chat.completions.create(
        model="smollm2-135m-instruct", messages=TARGETS[index], max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
        temperature=params.temperature, top_p=params.top_p, seed=params.seed, stream=True, extra_body=extra,
    )
    return "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])


async def test_streams_resumed_after_engine_kills_end_with_the_text_they_had_alone(
    default_model_path: Path, alone: list[RequestOutput], tmp_path: Path
) -> None:
    log = tmp_path / "gateway.log"
    with running_server(default_model_path, log_file=log) as server:
        async with openai.AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
            await wait_healthy(server)
            streams = asyncio.gather(*(stream_text(client, index) for index in range(len(TARGETS))))
            killed = await kill_engines(server, 2, random.Random(3))
            texts = await streams
        assert len(set(killed)) == 2 and not set(killed) & set(server.engine_pids())
    assert log.read_text().count(": resuming ") >= 1, "no stream was under way at a kill"
    assert texts == [output.outputs[0].text for output in alone]


def test_the_engine_says_it_is_batch_invariant_only_where_it_is(default_model_path: Path) -> None:
    # NOTE: switched off, the load-time plan may pick kernels by batch size, and /version says so.
    with LLM(str(default_model_path), multiprocess_mode=False, kv_cache_memory_gib=0.25, batch_invariant=False) as llm:
        assert llm.llm_engine.engine_core.ready.kernel_choices["batch invariant"] == "no (--no-batch-invariant)"
