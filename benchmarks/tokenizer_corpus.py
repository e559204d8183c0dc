"""A few hundred strings a tokenizer must split exactly as its reference does: several scripts, emoji,
digits, runs of spaces, tabs and newlines, contractions, code, and special-token text (the tests and
benchmarks/llama_server_greedy.py tokenize it)."""

from __future__ import annotations

import itertools

_WORDS = [
    "Hello", "world", "the", "capital", "of", "France", "is", "Paris", "it's", "we'll", "they'd", "HELLO'S",
    "naïve", "café", "résumé", "Straße", "ñandú", "Ελληνικά", "русский", "日本語のテキスト", "中文", "한국어",
    "العربية", "हिन्दी", "ภาษาไทย", "😀", "👍🏽", "👩‍👩‍👧", "🇫🇷", "🦙.cpp", "3.14159", "1234567890", "-42",
    "1e-9", "2024-06-01", "$100", "def", "fib(n):", "return", "x_1", "a+b=c", "<|im_start|>", "<s>", "</s>",
    "[INST]", "<start_of_turn>",
]
_GAPS = [" ", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "", "    "]


def tokenizer_corpus() -> list[str]:
    """The corpus: every word alone, then words joined by each kind of gap, then a few longer texts."""
    singles = [*_WORDS, *(f" {word}" for word in _WORDS), *(f"{word} " for word in _WORDS)]
    pairs = [f"{a}{gap}{b}" for (a, b), gap in zip(itertools.pairwise(_WORDS), itertools.cycle(_GAPS), strict=False)]
    spans = [
        gap.join(_WORDS[start : start + length])
        for start, length, gap in zip(range(0, len(_WORDS), 3), itertools.cycle((4, 7, 11)), itertools.cycle(_GAPS))
    ]
    texts = [
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # recursion\n",
        "Once upon a time, in a land far away, there lived a king who loved numbers like 12, 345 and 6789.",
        "   leading and trailing spaces   ",
        "line one\nline two\n\n\tindented\r\n",
        "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
        "",
        " ",
        "\n",
    ]
    return list(dict.fromkeys([*singles, *pairs, *spans, *texts]))
