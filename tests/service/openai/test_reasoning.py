"""Reasoning parsers: the whole answer and the answer streamed, cut at every position, split the
same reasoning from the same content, with the opening tag or without it."""

from __future__ import annotations

import pytest

from service.openai.reasoning import ReasoningStream, parse_reasoning

CASES = [
    # parser, answer, reasoning, content
    ("qwen3", "<think>\nThe user greets.\n</think>\n\nHello!", "\nThe user greets.\n", "\n\nHello!"),
    ("qwen3", "  <think>a < b</think>yes", "a < b", "yes"),
    ("qwen3", "Hello, no reasoning here.", None, "Hello, no reasoning here."),
    ("qwen3", "<thin is not a tag", None, "<thin is not a tag"),
    ("qwen3", "<think>cut off by max_tokens", "cut off by max_tokens", ""),
    ("deepseek_r1", "Reasoning without its opening tag.</think>The answer.", "Reasoning without its opening tag.", "The answer."),
    ("deepseek_r1", "<think>With it.</think>Answer", "With it.", "Answer"),
    ("deepseek_r1", "All reasoning, never closed", "All reasoning, never closed", ""),
]


@pytest.mark.parametrize(("parser", "text", "reasoning", "content"), CASES)
def test_whole_and_streamed_at_every_cut_agree(parser: str, text: str, reasoning: str | None, content: str) -> None:
    assert parse_reasoning(parser, text) == (reasoning, content)
    for pieces in [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]:
        stream = ReasoningStream(parser)
        parts = [stream.feed(piece) for piece in pieces] + [stream.finish()]
        streamed_reasoning = "".join(r for r, _ in parts)
        assert (streamed_reasoning if stream.has_reasoned else None, "".join(c for _, c in parts)) == (reasoning, content), pieces


def test_tags_never_reach_the_content_while_streaming() -> None:
    stream = ReasoningStream("qwen3")
    assert stream.feed("<thi") == ("", "")
    assert stream.feed("nk>step one") == ("step one", "")
    assert stream.feed(" </th") == (" ", "")
    assert stream.feed("ink>Done") == ("", "Done")
