"""Stop strings found in a text that grows piece by piece, at a bounded cost per character."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Where the text fed so far may be released: before any stop string, whole or begun.

    One Knuth-Morris-Pratt automaton per stop string remembers the longest prefix of that
    string the text ends with, so a new character costs O(1) per stop string (amortized),
    whatever the length of the text or of the stop strings: nothing is searched twice.
    Feeding stops at the first complete stop string.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stops)
        self._fallback = [_prefix_function(s) for s in self._stops]
        self._matched = [0] * len(self._stops)  # longest prefix of each stop ending the text
        self.length = 0  # characters fed
        self.found = False  # a complete stop string ends the text

    def feed(self, piece: str) -> None:
        """Append `piece` to the text (ignored once a stop string is found)."""
        if not self._stops:
            self.length += len(piece)
            return
        for char in piece:
            if self.found:
                return
            self.length += 1
            for i, stop in enumerate(self._stops):
                matched, fallback = self._matched[i], self._fallback[i]
                while matched and stop[matched] != char:
                    matched = fallback[matched - 1]
                if stop[matched] == char:
                    matched += 1
                self._matched[i] = matched
                self.found = self.found or matched == len(stop)

    @property
    def safe_length(self) -> int:
        """Characters of the text before the earliest stop string it holds or ends with a
        beginning of."""
        return self.length - max(self._matched, default=0)


def _prefix_function(s: str) -> list[int]:
    """`result[i]`: the length of the longest proper prefix of `s[: i + 1]` that is also its
    suffix (the KMP failure function)."""
    result = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = result[k - 1]
        if s[i] == s[k]:
            k += 1
        result[i] = k
    return result
