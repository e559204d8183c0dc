"""Turning a request's stream of new token ids into text deltas."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers.decoders import DecodeStream

from service.model_files.tokenizer import Tokenizer

# NOTE: a few prompt ids give the decoder its left context (a sentencepiece "▁word" keeps its
# space after a prompt), without decoding the whole prompt on the first step.
_PROMPT_CONTEXT = 5


class IncrementalDetokenizer:
    """One request's detokenizer: new ids in, whole characters out."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special_tokens: bool = True
    ) -> None:
        self._backend = tokenizer.backend
        context = list(prompt_ids[-_PROMPT_CONTEXT:])
        # NOTE: a prompt of raw ids may end inside a character; that prefix would leak into
        # the output as U+FFFD, so such a prompt gives no context.
        if self._backend.decode(context, skip_special_tokens=skip_special_tokens).endswith("\ufffd"):
            context = []
        self._stream = DecodeStream(ids=context, skip_special_tokens=skip_special_tokens)
        self._deltas: list[str] = []

    def update(self, new_token_ids: Sequence[int]) -> str:
        """The text the new ids complete; a character split over tokens waits until whole."""
        if not new_token_ids:
            return ""
        delta = self._stream.step(self._backend, list(new_token_ids)) or ""
        if delta:
            self._deltas.append(delta)
        return delta

    @property
    def output_text(self) -> str:
        """All text produced so far."""
        if len(self._deltas) > 1:
            self._deltas = ["".join(self._deltas)]
        return self._deltas[0] if self._deltas else ""
