"""/v1/completions through the official OpenAI SDK, on the tiny random model: every sampling knob
of the real engine (shapes, SSE framing, echo, stop strings and errors: test_completions_inproc.py)."""

from __future__ import annotations

import concurrent.futures
import math
from pathlib import Path
from typing import Any, cast

import openai
import pytest
import torch

from tests.server_process import ServerProcess

PROMPT = "The quick brown fox"
EOS_ID = 2
FORCED_ID = 19556  # "Hello"


VLLM_EXTRAS = {"ignore_eos", "top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids",
               "include_stop_str_in_output"}


def complete(sdk: openai.OpenAI, **kwargs: Any) -> Any:
    """A completion; the fields OpenAI lacks (vLLM's extensions) travel in `extra_body`."""
    extra_body = {**kwargs.pop("extra_body", {}), **{k: kwargs.pop(k) for k in VLLM_EXTRAS & kwargs.keys()}}
    return sdk.completions.create(
        model="tiny", **{"prompt": PROMPT, "max_tokens": 8, **kwargs}, extra_body=extra_body
    )


def streamed(sdk: openai.OpenAI, **kwargs: Any) -> tuple[dict[int, str], list[Any]]:
    """Per-choice text and the chunks of a streamed completion."""
    chunks = list(complete(sdk, stream=True, **kwargs))
    texts: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    return texts, chunks


def greedy_tokens(sdk: openai.OpenAI, num_tokens: int) -> list[str]:
    """The greedy continuation of PROMPT, one string per token."""
    whole = complete(sdk, temperature=0, max_tokens=num_tokens, ignore_eos=True, logprobs=0)
    return list(whole.choices[0].logprobs.tokens)


def prompt_ids(sdk: openai.OpenAI) -> list[int]:
    """PROMPT's token ids, as the server's /tokenize gives them."""
    tokens = cast(dict[str, Any], sdk.post("/../tokenize", body={"prompt": PROMPT}, cast_to=object))
    return list(tokens["tokens"])


def test_greedy_equivalents_top_k_1_tiny_top_p_and_min_p_1(sdk: openai.OpenAI) -> None:
    greedy = complete(sdk, temperature=0, ignore_eos=True).choices[0].text
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        assert complete(sdk, temperature=1.0, ignore_eos=True, **extra).choices[0].text == greedy
    assert complete(sdk, temperature=1.0, top_p=1e-6, ignore_eos=True).choices[0].text == greedy


def test_logit_bias_forces_a_token(sdk: openai.OpenAI) -> None:
    whole = complete(sdk, temperature=0, max_tokens=3, logit_bias={str(FORCED_ID): 100}, ignore_eos=True)
    assert whole.choices[0].text == "Hello" * 3


def test_stop_token_ids_min_tokens_and_ignore_eos(sdk: openai.OpenAI) -> None:
    forced = {"logit_bias": {str(FORCED_ID): 100}, "temperature": 0}
    first = complete(sdk, **forced, stop_token_ids=[FORCED_ID])
    assert first.choices[0].finish_reason == "stop" and first.usage.completion_tokens == 1
    assert first.choices[0].model_extra["stop_reason"] == FORCED_ID
    later = complete(sdk, **forced, stop_token_ids=[FORCED_ID], min_tokens=3)
    assert later.choices[0].finish_reason == "stop" and later.usage.completion_tokens == 4
    eos = {"logit_bias": {str(EOS_ID): 100}, "temperature": 0}
    assert complete(sdk, **eos).usage.completion_tokens == 1
    ignored = complete(sdk, **eos, max_tokens=3, ignore_eos=True)
    assert ignored.choices[0].finish_reason == "length" and ignored.usage.completion_tokens == 3


def test_penalties_discourage_repeats(sdk: openai.OpenAI) -> None:
    plain = greedy_tokens(sdk, 24)
    assert len(set(plain)) < len(plain)  # a random model loops
    for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        whole = complete(sdk, temperature=0, max_tokens=24, ignore_eos=True, logprobs=0, **penalty)
        assert len(set(whole.choices[0].logprobs.tokens)) > len(set(plain))
    whole = complete(sdk, temperature=0, max_tokens=24, ignore_eos=True, logprobs=0,
                     repetition_penalty=1e6)
    assert len(set(whole.choices[0].logprobs.tokens)) > len(set(plain))


def test_n_with_seed_is_reproducible_streamed_or_not(sdk: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"n": 3, "seed": 1234, "temperature": 1.0, "ignore_eos": True}
    first = complete(sdk, **kwargs)
    texts = [c.text for c in first.choices]
    assert len(set(texts)) == 3
    assert [c.text for c in complete(sdk, **kwargs).choices] == texts
    streamed_texts, _ = streamed(sdk, **kwargs)
    assert [streamed_texts[i] for i in range(3)] == texts


def test_greedy_samples_agree_whatever_the_prompt_form(sdk: openai.OpenAI) -> None:
    ids = prompt_ids(sdk)
    by_text = complete(sdk, temperature=0, ignore_eos=True).choices[0].text
    assert complete(sdk, prompt=ids, temperature=0, ignore_eos=True).choices[0].text == by_text
    many = complete(sdk, prompt=[PROMPT, "Another prompt"], n=2, temperature=0, ignore_eos=True)
    assert many.choices[0].text == many.choices[1].text == by_text
    assert complete(sdk, prompt=[ids, ids], temperature=0, ignore_eos=True).choices[1].text == by_text


def test_logprobs_are_log_softmax_over_the_whole_vocab(sdk: openai.OpenAI, tiny_model_dir: Path) -> None:
    from transformers import LlamaForCausalLM

    ids = prompt_ids(sdk)
    whole = complete(sdk, prompt=ids, temperature=0, max_tokens=1, logprobs=5)
    logprobs = whole.choices[0].logprobs
    top = logprobs.top_logprobs[0]
    assert len(top) == 5 and logprobs.tokens[0] in top
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir).eval()  # type: ignore[no-untyped-call]
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0, -1].log_softmax(dim=-1)
    assert math.isclose(float(reference.exp().sum()), 1.0, abs_tol=1e-3)
    assert sorted(top.values(), reverse=True) == pytest.approx(reference.topk(5).values.tolist(), abs=1e-3)
    assert logprobs.token_logprobs[0] == pytest.approx(float(reference.max()), abs=1e-3)


def test_seeded_request_is_the_same_alone_or_among_15_others(sdk: openai.OpenAI, tiny_server: ServerProcess) -> None:
    seeded = {"prompt": PROMPT, "temperature": 0.8, "top_p": 0.9, "seed": 77, "max_tokens": 12, "ignore_eos": True}
    alone = complete(sdk, **seeded).choices[0].text

    def run(index: int) -> str:
        with openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0) as client:
            if index == 0:
                return str(complete(client, **seeded).choices[0].text)
            noise = {"prompt": f"Other request {index} " * index, "temperature": 1.0, "max_tokens": 12 + index,
                     "ignore_eos": True, "top_k": 5 + index}
            return str(complete(client, **noise).choices[0].text)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(run, range(16)))
    assert together[0] == alone


def test_prompt_logprobs_and_echo_with_logprobs(sdk: openai.OpenAI, tiny_model_dir: Path) -> None:
    from transformers import LlamaForCausalLM

    ids = prompt_ids(sdk)
    model = LlamaForCausalLM.from_pretrained(tiny_model_dir).eval()  # type: ignore[no-untyped-call]
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].log_softmax(dim=-1)
    expected = [float(reference[i - 1, ids[i]]) for i in range(1, len(ids))]
    whole = complete(sdk, prompt=ids, temperature=0, max_tokens=2, extra_body={"prompt_logprobs": 3})
    positions = whole.choices[0].model_extra["prompt_logprobs"]
    assert [p[str(t)]["logprob"] for p, t in zip(positions[1:], ids[1:], strict=True)] == pytest.approx(expected, abs=1e-3)
    echoed = complete(sdk, prompt=ids, temperature=0, max_tokens=2, echo=True, logprobs=2)
    assert echoed.choices[0].logprobs.token_logprobs[1 : len(ids)] == pytest.approx(expected, abs=1e-3)


def test_a_repeated_long_prompt_reports_its_cached_tokens_streamed_or_not(sdk: openai.OpenAI) -> None:
    prompt = "Caching test: " + " ".join(f"word{i}" for i in range(60))
    first = sdk.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert first.usage is not None and first.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = sdk.completions.create(model="tiny", prompt=prompt, max_tokens=2)
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    # NOTE: whole 16-token blocks, short of the last token (recomputed for its logits).
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and 16 <= cached < again.usage.prompt_tokens and cached % 16 == 0
    sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=2)
    again_chat = sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}],
                                             max_tokens=2, stream=True, stream_options={"include_usage": True})
    *_, last = list(again_chat)
    assert last.usage is not None and last.usage.prompt_tokens_details is not None
    assert (last.usage.prompt_tokens_details.cached_tokens or 0) >= 16
