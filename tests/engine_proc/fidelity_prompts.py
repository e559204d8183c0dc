"""The chat questions the fidelity tests ask the real model, and how they decode."""

from __future__ import annotations

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in two sentences why the sky is blue.",
    "List three prime numbers.",
]
MAX_NEW_TOKENS = 40
NGRAM_DRAFTS = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'
