"""LLM: offline generate/chat on a real engine (tiny random model), results in input order."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from service import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_dir: Path) -> Iterator[LLM]:
    with LLM(
        str(tiny_model_dir), kv_cache_memory_gib=0.05, max_model_len=1024, num_threads=1, stats_log_interval_s=0.05
    ) as llm:
        yield llm


def test_generate_returns_200_outputs_in_input_order(llm: LLM) -> None:
    prompts = [f"Prompt number {i} says" + " more" * (i % 7) for i in range(200)]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    assert [o.prompt for o in outputs] == prompts
    assert [o.prompt_token_ids for o in outputs] == [tokenizer.encode(p, add_special_tokens=True) for p in prompts]
    for output in outputs:
        assert output.finished and len(output.outputs) == 1
        completion = output.outputs[0]
        assert len(completion.token_ids) == 3 and completion.finish_reason == "length"
        assert completion.text == tokenizer.decode(completion.token_ids)


def test_one_prompt_and_token_prompts(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    [by_text] = llm.generate("Hello there", params, use_tqdm=False)
    token_ids = llm.get_tokenizer().encode("Hello there", add_special_tokens=True)
    [by_ids] = llm.generate({"prompt_token_ids": token_ids}, params, use_tqdm=False)
    assert by_ids.prompt is None and by_ids.prompt_token_ids == token_ids
    assert by_ids.outputs[0].token_ids == by_text.outputs[0].token_ids


def test_n_samples_come_back_indexed_and_reproducible(llm: LLM) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    [first] = llm.generate("Once upon a time", params, use_tqdm=False)
    [again] = llm.generate("Once upon a time", params, use_tqdm=False)
    assert [c.index for c in first.outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 8 for c in first.outputs)
    assert len({tuple(c.token_ids) for c in first.outputs}) > 1
    assert [c.token_ids for c in first.outputs] == [c.token_ids for c in again.outputs]


def test_sampling_params_per_prompt(llm: LLM) -> None:
    outputs = llm.generate(
        ["a", "b"],
        [SamplingParams(max_tokens=2, ignore_eos=True), SamplingParams(max_tokens=5, ignore_eos=True)],
        use_tqdm=False,
    )
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2, 5]
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False)


def test_stop_strings_end_the_text(llm: LLM) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    [probe] = llm.generate("The quick brown fox", params, use_tqdm=False)
    text = probe.outputs[0].text
    stop = text[3:5]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, stop=[stop])
    [stopped] = llm.generate("The quick brown fox", params, use_tqdm=False)
    assert stopped.outputs[0].text == text[: text.index(stop)]
    assert stopped.outputs[0].finish_reason == "stop" and stopped.outputs[0].stop_reason == stop


def test_chat_renders_each_conversation(llm: LLM) -> None:
    conversations = [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
    ]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    outputs = llm.chat(conversations, params, use_tqdm=False)
    tokenizer = llm.get_tokenizer()
    assert len(outputs) == 2
    for conversation, output in zip(conversations, outputs, strict=True):
        expected = tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        assert output.prompt == expected
        assert output.prompt_token_ids == tokenizer.encode(expected)
    [single] = llm.chat(conversations[0], params, use_tqdm=False)
    assert single.outputs[0].token_ids == outputs[0].outputs[0].token_ids


def test_requests_while_asleep_are_refused(llm: LLM) -> None:
    llm.sleep(1)
    with pytest.raises(RuntimeError, match="asleep"):
        llm.generate("hello", SamplingParams(max_tokens=2), use_tqdm=False)
    llm.wake_up()
    [output] = llm.generate("hello", SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(output.outputs[0].token_ids) == 2


def test_bad_prompt_is_refused_and_nothing_is_left_running(llm: LLM) -> None:
    with pytest.raises(ValueError, match="maximum context length"):
        llm.generate(["fine", "too long"], [SamplingParams(max_tokens=2), SamplingParams(max_tokens=5000)],
                     use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()
    stats = llm.get_stats()
    assert stats.num_running_reqs + stats.num_waiting_reqs == 0


def test_stats_log_line_while_working(llm: LLM, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="zeroserve.stats"):
        llm.generate(["x"] * 8, SamplingParams(max_tokens=40, ignore_eos=True), use_tqdm=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "zeroserve.stats"]
    assert lines, "no stats line while generating"
    assert all("Avg generation throughput" in line and "KV cache usage" in line for line in lines)


def test_settings_not_given_come_from_the_commands_variables(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZEROSERVE_DTYPE", "float32")
    monkeypatch.setenv("ZEROSERVE_MAX_MODEL_LEN", "512")
    monkeypatch.setenv("ZEROSERVE_MAX_NUM_SEQS", "5")
    with LLM(str(tiny_model_dir), multiprocess_mode=False, kv_cache_memory_gib=0.05, max_num_seqs=3) as llm:
        core = llm.llm_engine.engine_core
        assert core.ready.max_model_len == 512
        assert core.engine_core.config.max_num_seqs == 3  # NOTE: given beats the variable
        assert str(core.engine_core.model_runner.dtype) == "torch.float32"
        params = SamplingParams(temperature=0.0, max_tokens=600, ignore_eos=True)
        with pytest.raises(ValueError, match="512"):
            llm.generate("Hello", params, use_tqdm=False)
