"""Stop strings at a bounded cost per token (issue 24): the engine's incremental search finds
what a search of the whole decoded text after every token found (the old rule), on byte-level
BPE text with multi-byte characters split over tokens, and decodes O(1) tokens per token."""

import random

import pytest

from core_engine.detokenize import MAX_UNDECODED_TOKENS, IncrementalDecoder, StopScan
from core_engine.toy import byte_bpe_tokenizer, char_tokenizer

WORDS = ["the", "sum", "is", "héllo", "wörld", "日本語", "答え", "7", "42", "+", "=", "\n"]


@pytest.fixture(scope="module")
def bpe():
    corpus = [" ".join(random.Random(i).choices(WORDS, k=16)) for i in range(300)]
    return byte_bpe_tokenizer(corpus, ["<|endoftext|>"], eos_token="<|endoftext|>")


def whole_text_search(tokenizer, ids, stops):
    """The old rule: after every token, decode everything and take the earliest stop."""
    for end in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:end], skip_special_tokens=True)
        hits = [(text.find(s), s) for s in stops if s in text]
        if hits:
            index, stop = min(hits)
            return end, (text[:index], stop)
    return None, None


def incremental_search(tokenizer, ids, stops):
    scan = StopScan(tokenizer, stops)
    for end, token in enumerate(ids, start=1):
        hit = scan.push(token)
        if hit is not None:
            return end, hit
    return None, None


@pytest.mark.parametrize("name", ["bpe", "char"])
def test_the_incremental_search_finds_what_the_whole_text_search_found(name, bpe):
    tokenizer = bpe if name == "bpe" else char_tokenizer()
    rng = random.Random(0)
    found = 0
    for trial in range(150):
        text = " ".join(rng.choices(WORDS, k=30))
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if trial % 3 == 0:  # also ids that do not form a clean text: split characters
            ids = [rng.randrange(len(tokenizer)) for _ in range(40)]
        pieces = [text[i : i + rng.randint(1, 6)] for i in rng.sample(range(len(text)), 3)]
        stops = [*pieces, "never there"] if name == "bpe" else [*pieces]
        expected = whole_text_search(tokenizer, ids, stops)
        assert incremental_search(tokenizer, ids, stops) == expected, (ids, stops)
        found += expected[0] is not None
    assert found > 50  # most trials stop somewhere: the comparison has teeth


def test_a_long_output_decodes_a_bounded_window_per_token(bpe):
    """The old rule decoded n(n+1)/2 tokens for an n-token output; now O(n)."""
    decoded = []

    class Counting:
        def decode(self, ids, **kwargs):
            decoded.append(len(ids))
            return bpe.decode(ids, **kwargs)

    text = " ".join(random.Random(1).choices(WORDS, k=2000))
    ids = bpe(text, add_special_tokens=False)["input_ids"]
    scan = StopScan(Counting(), ["never there", "nor this"])
    assert all(scan.push(token) is None for token in ids)
    assert sum(decoded) <= 2 * (2 * MAX_UNDECODED_TOKENS) * len(ids)
    assert max(decoded) <= 2 * MAX_UNDECODED_TOKENS
    assert len(ids) > 1000


def test_the_decoder_gives_the_whole_text_piece_by_piece(bpe):
    text = " ".join(random.Random(2).choices(WORDS, k=200))
    ids = bpe(text, add_special_tokens=False)["input_ids"]
    decoder = IncrementalDecoder(bpe)
    assert "".join(decoder.push(token) for token in ids) == text
