"""Incremental detokenization for streaming, safe around stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class IncrementalText:
    """Releases a growing completion's text piece by piece, never ahead of what is final.

    Held back: anything from a matched stop string on, a tail that could still become a stop
    string, and an incomplete UTF-8 character. The engine trims the final text at the stop
    string itself; `finish` releases the rest of that text. Each push decodes the whole
    output (as the engine's stop-string check does), so the cost grows with its length.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._stop = tuple(stop)
        self._ids: list[int] = []
        self._sent = ""

    def push(self, token_id: int) -> str:
        """Add a generated token; return the newly releasable text (maybe empty)."""
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids, skip_special_tokens=True)
        return self._release(_stable_prefix(text.rstrip("\ufffd"), self._stop))

    def finish(self, final_text: str) -> str:
        """Release what remains of the engine's final text."""
        return self._release(final_text)

    def _release(self, text: str) -> str:
        if not text.startswith(self._sent):
            return ""
        delta, self._sent = text[len(self._sent) :], text
        return delta


def _stable_prefix(text: str, stops: Sequence[str]) -> str:
    """`text` cut before the first stop string and before any tail that starts one."""
    if not stops:
        return text
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    text = text[:cut]
    for start in range(max(0, len(text) - max(map(len, stops)) + 1), len(text)):
        if any(s.startswith(text[start:]) for s in stops):
            return text[:start]
    return text
