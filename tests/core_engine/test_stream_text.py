"""Streamed text: stop strings matched incrementally, tokens decoded in a bounded window."""

from __future__ import annotations

import random

import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from core_engine.detokenize import MAX_UNDECODED_TOKENS
from core_engine.network.detok import IncrementalText
from core_engine.network.stops import StopMatcher
from core_engine.toy import char_tokenizer


def held_back_from(text: str, stops: list[str]) -> int:
    """The rule, by brute force: `text` is final up to its first stop string and up to any
    tail that begins one."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    starts = [i for i in range(cut) if any(s.startswith(text[i:cut]) for s in stops)]
    return min(starts, default=cut)


def test_stop_matcher_follows_the_rule_piece_by_piece():
    rng = random.Random(0)
    for _ in range(3000):
        alphabet = rng.choice(["ab", "abc"])
        stops = ["".join(rng.choices(alphabet, k=rng.randint(1, 5))) for _ in range(3)]
        text = "".join(rng.choices(alphabet, k=rng.randint(0, 30)))
        matcher = StopMatcher(stops)
        at = 0
        while at < len(text) and not matcher.found:
            size = rng.randint(1, 4)
            matcher.feed(text[at : at + size])
            at += size
        fed = text[: matcher.length]
        if matcher.found:  # stops at the first stop string, never past where it starts
            first = min(i for i in (fed.find(s) for s in stops) if i >= 0)
            assert matcher.safe_length <= first
            assert not any(s in fed[:-1] for s in stops), "fed past a complete stop string"
        else:
            assert matcher.safe_length == held_back_from(fed, stops), (stops, fed)


class CountingTokenizer:
    """A tokenizer that records how many ids each decode call is given."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.decoded: list[int] = []

    def decode(self, ids, **kwargs):
        self.decoded.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


def test_a_token_costs_a_bounded_window_however_long_the_output():
    tokenizer = CountingTokenizer(char_tokenizer())
    output = "the quick brown fox jumps over the lazy dog. " * 100
    stops = [output[5:260] + "?", "z" * 255 + "!"]  # the longest, always partly matched
    text = IncrementalText(tokenizer, stops)
    ids = tokenizer.tokenizer.encode(output, add_special_tokens=False)
    streamed = "".join(text.push(token) for token in ids)
    assert max(tokenizer.decoded) <= 2 * MAX_UNDECODED_TOKENS
    assert sum(tokenizer.decoded) <= 4 * len(ids)
    assert len(output) - len(streamed) < 256, "only a possible stop string's start is held"
    assert streamed + text.finish(output) == output


def byte_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """One token per UTF-8 byte (as byte-level BPE vocabularies start): a character beyond
    ASCII spans several tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend)


@pytest.mark.parametrize("stops", [[], ["ö!"]])
def test_characters_split_across_tokens_are_released_whole(stops):
    tokenizer = byte_tokenizer()
    output = "héllo wörld ✓ 日本 " * 3
    text = IncrementalText(tokenizer, stops)
    pieces = [text.push(token) for token in tokenizer.encode(output)]
    assert len(tokenizer.encode(output)) > len(output), "several tokens per character"
    assert not any("\ufffd" in piece for piece in pieces)
    assert "".join(pieces) + text.finish(output) == output


def test_a_run_of_undecodable_tokens_is_released_as_it_decodes():
    tokenizer = byte_tokenizer()
    stray = [tokenizer.encode("é")[1]] * (3 * MAX_UNDECODED_TOKENS + 2)  # continuation bytes
    final = tokenizer.decode(stray)
    text = IncrementalText(tokenizer, [])
    streamed = "".join(text.push(token) for token in stray)
    assert set(final) == {"\ufffd"}
    assert len(streamed) > len(final) - MAX_UNDECODED_TOKENS, "held back a bounded run only"
    assert streamed + text.finish(final) == final
