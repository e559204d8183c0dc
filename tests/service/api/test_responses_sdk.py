"""Stored Responses through the official OpenAI SDK against real tiny-model server processes: a
three-turn conversation by previous_response_id answers as the same conversation sent whole, the
continued turns' prompts come from the prefix cache, and the conversation continues after the
server restarts on the same store."""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.server_process import ServerProcess, running_server

pytestmark = pytest.mark.slow

QUESTIONS = ("Name a colour.", "Name another one.", "And a third?")
GREEDY: dict[str, Any] = {"model": "tiny", "instructions": "Be brief.", "temperature": 0, "max_output_tokens": 8}


def restarted(tiny_model_dir: Path, store: Path) -> AbstractContextManager[ServerProcess]:
    return running_server(tiny_model_dir, "--served-model-name", "tiny", "--responses-store", str(store))


def sdk(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_three_turns_by_previous_response_id_answer_as_sent_whole_across_a_restart(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    store = tmp_path / "responses.sqlite"
    with restarted(tiny_model_dir, store) as server, sdk(server) as client:
        first = client.responses.create(input=QUESTIONS[0], **GREEDY)
        second = client.responses.create(input=QUESTIONS[1], previous_response_id=first.id, **GREEDY)
        assert second.usage is not None and second.usage.input_tokens_details.cached_tokens > 0
    with restarted(tiny_model_dir, store) as server, sdk(server) as client:
        assert client.responses.retrieve(second.id).output_text == second.output_text
        third = client.responses.create(input=QUESTIONS[2], previous_response_id=second.id, **GREEDY)
        whole: list[Any] = []
        for question, answer in zip(QUESTIONS, (first, second), strict=False):
            whole += [{"role": "user", "content": question}, {"role": "assistant", "content": answer.output_text}]
        sent_whole = client.responses.create(input=[*whole, {"role": "user", "content": QUESTIONS[2]}], **GREEDY)
        assert third.output_text and sent_whole.output_text == third.output_text
        assert third.usage is not None and sent_whole.usage is not None
        assert sent_whole.usage.input_tokens == third.usage.input_tokens
        items = client.responses.input_items.list(third.id, order="asc")
        assert len(items.data) == 5 and items.data[-1].content[0].text == QUESTIONS[2]  # type: ignore[union-attr]
