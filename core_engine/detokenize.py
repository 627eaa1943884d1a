"""Text of a growing completion at a bounded cost per token: incremental detokenization (as
vLLM's detokenizer) and the engine's stop-string search over only the text a token can
complete, so a request with stop strings costs linear, not quadratic, time in its length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Tokens held back while they add no text or end in an incomplete UTF-8 character; a longer
# run is released as it decodes (U+FFFD included), which bounds the window decoded per token.
MAX_UNDECODED_TOKENS = 8


class IncrementalDecoder:
    """The text each new token adds. Each token decodes only a window: the tokens of the last
    decoded piece (for context: some tokenizers spell a token differently at the start of a
    text) and the new ones, at most `2 * MAX_UNDECODED_TOKENS`, so a token costs the same at
    the start and at the end of a long output."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0  # first token of the window: the last decoded piece's
        self._read_offset = 0  # tokens whose text has been decoded

    def push(self, token_id: int) -> str:
        """Add a token; return the text it (and any held-back tokens) add, once whole."""
        self._ids.append(token_id)
        window = self._ids[self._prefix_offset :]
        context = self._decode(window[: self._read_offset - self._prefix_offset])
        text = self._decode(window)
        whole = len(text) > len(context) and not text.endswith("\ufffd")
        if not whole and len(self._ids) - self._read_offset < MAX_UNDECODED_TOKENS:
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return text[len(context) :]

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True) if ids else ""


class StopScan:
    """A request's text, grown token by token, searched for its stop strings only where a new
    occurrence can be: the new text and the `longest stop - 1` characters before it. Every
    earlier occurrence would have been found earlier, so the first hit is the text's first
    occurrence, as a search of the whole text after every token would find it."""

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        self._decoder = IncrementalDecoder(tokenizer)
        self._stops = tuple(stops)
        self._keep = max(map(len, self._stops)) - 1  # tail a later token can complete
        self._pieces: list[str] = []
        self._length = 0
        self._tail = ""

    def push(self, token_id: int) -> tuple[str, str] | None:
        """Add a generated token; on the earliest complete stop string, (the text before
        it, the stop string)."""
        new = self._decoder.push(token_id)
        if not new:
            return None
        window = self._tail + new
        offset = self._length - len(self._tail)  # where the window starts in the text
        self._pieces.append(new)
        self._length += len(new)
        self._tail = window[-self._keep :] if self._keep else ""
        hits = [(index, s) for s in self._stops if (index := window.find(s)) >= 0]
        if not hits:
            return None
        index, stop = min(hits)
        return "".join(self._pieces)[: offset + index], stop
