"""InputProcessor: chat rendering, the n fan-out, and what the engine is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from proto import engine_input
from proto.codec import MsgpackDecoder, MsgpackEncoder
from proto.engine_input import EngineCoreRequest, SamplingParamsError
from service.frontend.input_processor import InputProcessor, PromptTooLongError
from service.frontend.sampling_params import SamplingParams
from service.model_files.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def processor(default_model_path: Path) -> InputProcessor:
    tokenizer = Tokenizer.from_model(default_model_path)
    return InputProcessor(tokenizer, max_model_len=64, vocab_size=tokenizer.vocab_size)


def test_n_samples_become_engine_requests_without_the_gateways_fields(processor: InputProcessor) -> None:
    params = SamplingParams(n=3, seed=5, stop=["END"], include_stop_str_in_output=True, max_tokens=4)
    requests = processor.process("req", [1, 2, 3], params, priority=2, data_parallel_rank=1)
    assert [r.request_id for r in requests] == ["req-0", "req-1", "req-2"]
    assert [r.sampling_params.seed for r in requests] == [5, 6, 7]
    assert all(type(r.sampling_params) is engine_input.SamplingParams for r in requests)
    assert all(r.priority == 2 and r.data_parallel_rank == 1 for r in requests)
    frames = MsgpackEncoder().encode(requests[1])
    decoded = MsgpackDecoder(EngineCoreRequest).decode(frames)
    assert decoded == requests[1]
    assert b"END" not in bytes(frames[0]) and b"include_stop_str_in_output" not in bytes(frames[0])
    assert processor.process("solo", [1], SamplingParams())[0].request_id == "solo"
    assert [r.sampling_params.seed for r in processor.process("r", [1], SamplingParams(n=2, max_tokens=4))] == [None, None]
    wrapped = processor.process("r", [1], SamplingParams(n=2, seed=2**63 - 1, max_tokens=4))
    assert [r.sampling_params.seed for r in wrapped] == [2**63 - 1, -(2**63)]  # NOTE: int64 on the wire


@pytest.mark.parametrize(
    ("prompt_ids", "params", "error", "name"),
    [
        ([], SamplingParams(), ValueError, None),
        ([1, 10**9], SamplingParams(), ValueError, None),
        ([1] * 60, SamplingParams(max_tokens=8), PromptTooLongError, None),
        ([1], SamplingParams(logit_bias=[(10**9, 1.0)]), SamplingParamsError, "logit_bias"),
        ([1], SamplingParams(stop_token_ids=[10**9]), SamplingParamsError, "stop_token_ids"),
    ],
)
def test_bad_prompts_and_ids_beyond_the_vocabulary_are_refused(
    processor: InputProcessor, prompt_ids: list[int], params: SamplingParams, error: type[Exception],
    name: str | None,
) -> None:
    with pytest.raises(error) as raised:
        processor.process("bad", prompt_ids, params)
    if name is not None:
        assert isinstance(raised.value, SamplingParamsError) and raised.value.name == name


def test_sampling_ranges_name_the_parameter() -> None:
    for kwargs, name in [({"n": 0}, "n"), ({"temperature": -1.0}, "temperature"), ({"seed": 2**63}, "seed"),
                         ({"num_logprobs": 21}, "num_logprobs"), ({"logit_bias": [(1, 101.0)]}, "logit_bias")]:
        with pytest.raises(SamplingParamsError) as raised:
            SamplingParams(**kwargs)  # type: ignore[arg-type]
        assert raised.value.name == name


def test_chat_prompt_renders_then_tokenizes_and_can_continue_the_last_message(processor: InputProcessor) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I am"}]
    prompt = processor.chat_prompt(messages[:1])
    assert prompt.text is not None and prompt.text.rstrip().endswith("assistant")
    assert prompt.token_ids == processor.tokenizer.encode(prompt.text)
    continued = processor.chat_prompt(messages, add_generation_prompt=False, continue_final_message=True)
    assert continued.text is not None and continued.text.endswith("Hello, I am")
