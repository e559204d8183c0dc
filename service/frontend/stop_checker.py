"""Stop strings, checked on the detokenized text as it grows.

Text that might be the start of a stop string is held back until the next tokens show that it
is not (then it is released) or that it is (then the request stops there and the held text,
the stop string included, never reaches the client unless `include_stop_str_in_output`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class StopCheck(NamedTuple):
    """Text that is safe to send now, and the stop string that ended the request, if any."""

    text: str
    stop_str: str | None


class StopChecker:
    """One request's stop strings and the text not yet released."""

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        self.stop = [s for s in stop if s]
        self.include_stop_str_in_output = include_stop_str_in_output
        self._max_len = max((len(s) for s in self.stop), default=0)
        self._pending = ""

    def update(self, delta: str) -> StopCheck:
        """Adds new text; returns what may be released and the stop string found, if one was."""
        if not self.stop:
            return StopCheck(delta, None)
        text = self._pending + delta
        # NOTE: a stop string ending in the new text starts at most max_len - 1 characters back;
        # the pending text never contains a whole stop string, so searching all of it is enough.
        match = min(
            ((index, s) for s in self.stop if (index := text.find(s)) != -1), default=None
        )
        if match is not None:
            index, stop_str = match
            end = index + len(stop_str) if self.include_stop_str_in_output else index
            self._pending = ""
            return StopCheck(text[:end], stop_str)
        num_held = self._num_held(text)
        self._pending = text[len(text) - num_held :]
        return StopCheck(text[: len(text) - num_held], None)

    def flush(self) -> str:
        """The held text, released because the request ended without a stop string."""
        text, self._pending = self._pending, ""
        return text

    def _num_held(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        for length in range(min(self._max_len - 1, len(text)), 0, -1):
            suffix = text[-length:]
            if any(s.startswith(suffix) for s in self.stop):
                return length
        return 0
