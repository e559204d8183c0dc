"""A server with n-gram drafts: greedy streams read exactly as without them, stop strings included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.server_process import ServerProcess, running_server

PROMPT = "one two three one two three one two three one two"


@pytest.fixture(scope="module")
def drafting_server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    spec = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
    with running_server(tiny_model_dir, "--served-model-name", "tiny", "--speculative-config", spec) as server:
        yield server


def stream_text(base_url: str, **params: object) -> tuple[str, int, str | None]:
    """(text, number of chunks with text, finish reason) of a streamed greedy completion."""
    text, num_chunks, finish_reason = "", 0, None
    with openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        for chunk in client.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=48, temperature=0, stream=True, **params  # type: ignore[call-overload]
        ):
            choice = chunk.choices[0]
            text += choice.text
            num_chunks += bool(choice.text)
            finish_reason = choice.finish_reason or finish_reason
    return text, num_chunks, finish_reason


def accepted_tokens(base_url: str) -> float:
    for line in httpx.get(f"{base_url}/metrics").text.splitlines():
        if line.startswith("zeroserve:spec_decode_num_accepted_tokens_total{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no accepted-tokens counter")


def num_token_gaps(base_url: str) -> float:
    """How many times the server has seen a request's next tokens arrive after earlier ones."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in httpx.get(f"{base_url}/metrics").text.splitlines()
        if line.startswith("zeroserve:inter_token_latency_seconds_count{")
    )


def test_greedy_stream_is_the_same_with_drafts_in_fewer_steps(
    tiny_server: ServerProcess, drafting_server: ServerProcess
) -> None:
    plain_gaps, drafted_gaps = num_token_gaps(tiny_server.base_url), num_token_gaps(drafting_server.base_url)
    plain, num_plain_chunks, _ = stream_text(tiny_server.base_url)
    drafted, num_drafted_chunks, finish_reason = stream_text(drafting_server.base_url)
    assert drafted == plain
    assert finish_reason == "length"
    # Accepted drafts arrive together with the token after them, several to an engine step (and
    # so to a chunk). NOTE: steps, not the chunks the client counts: a client reading slower
    # than the engine steps gets several steps' tokens in a chunk either way.
    assert accepted_tokens(drafting_server.base_url) > 0
    assert num_drafted_chunks <= 48 and num_plain_chunks <= 48
    plain_gaps = num_token_gaps(tiny_server.base_url) - plain_gaps
    drafted_gaps = num_token_gaps(drafting_server.base_url) - drafted_gaps
    assert plain_gaps == 47 and drafted_gaps < plain_gaps


def test_a_stop_string_inside_a_drafted_run_ends_the_text_before_it(
    tiny_server: ServerProcess, drafting_server: ServerProcess
) -> None:
    plain, _, _ = stream_text(tiny_server.base_url)
    stop = plain[len(plain) // 2 : len(plain) // 2 + 3]
    drafted, _, finish_reason = stream_text(drafting_server.base_url, stop=[stop])
    assert finish_reason == "stop"
    assert drafted == plain[: plain.index(stop)]
