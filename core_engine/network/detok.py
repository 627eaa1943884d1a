"""Incremental detokenization for streaming, safe around stop strings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core_engine.detokenize import IncrementalDecoder
from core_engine.network.stops import StopMatcher


class IncrementalText:
    """Releases a growing completion's text piece by piece, never ahead of what is final.

    Held back: anything from a matched stop string on, a tail that could still become a stop
    string, and an incomplete UTF-8 character. Tokens are decoded a window at a time
    (`core_engine.detokenize.IncrementalDecoder`) and only the new characters go to the stop
    matcher, so a token costs the same at the start and at the end of a long output. The
    engine trims the final text at the stop string itself; `finish` releases the rest.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str]) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._stops = StopMatcher(stop)
        self._held = ""  # decoded text not released yet
        self._released: list[str] = []
        self._released_chars = 0

    def push(self, token_id: int) -> str:
        """Add a generated token; return the newly releasable text (maybe empty)."""
        if self._stops.found:  # nothing more before `finish`
            return ""
        new = self._decoder.push(token_id)
        self._stops.feed(new)
        self._held += new
        return self._release(self._stops.safe_length - self._released_chars)

    def finish(self, final_text: str) -> str:
        """Release what remains of the engine's final text."""
        released = "".join(self._released)
        if not final_text.startswith(released):
            return ""
        self._held = final_text[len(released) :]
        return self._release(len(self._held))

    def _release(self, chars: int) -> str:
        piece, self._held = self._held[:chars], self._held[chars:]
        if piece:
            self._released.append(piece)
            self._released_chars += len(piece)
        return piece
