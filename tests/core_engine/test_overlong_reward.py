"""DAPO's soft overlong punishment as the `overlong` reward, against the paper's formula
(Yu et al. 2025, 2503.14476, eq. 13)."""

import re
from fractions import Fraction

import pytest

from core_engine.rl.rewards import check_reward_spec
from core_engine.rl.rewards.mix import RewardMix, parse_rewards


def dapo_eq13(length: int, l_max: int, l_cache: int) -> Fraction:
    """R_length(y) as the paper writes it, in exact arithmetic."""
    if length <= l_max - l_cache:
        return Fraction(0)
    if length <= l_max:
        return Fraction((l_max - l_cache) - length, l_cache)
    return Fraction(-1)


@pytest.mark.parametrize(("l_max", "l_cache", "max_tokens"), [(20, 8, 32), (16, 16, 16), (7, 1, 9)])
def test_overlong_is_the_papers_formula(l_max, l_cache, max_tokens):
    spec = [{"name": "overlong", "max_length": l_max, "cache_length": l_cache}]
    lengths = list(range(max_tokens + 1))
    _, parts = RewardMix(spec, max_tokens).score(
        [""] * len(lengths), [""] * len(lengths), [""] * len(lengths), lengths
    )
    truth = [float(dapo_eq13(n, l_max, l_cache)) for n in lengths]
    assert parts["overlong"] == pytest.approx(truth, abs=1e-12)


def test_max_length_defaults_to_the_jobs_max_tokens_and_the_cache_to_a_fifth_of_it():
    [term] = parse_rewards([{"name": "overlong", "cache_length": 4}], max_tokens=12)
    assert term.max_length == 12
    [term] = parse_rewards([{"name": "overlong"}], max_tokens=20480)
    assert (term.max_length, term.cache_length) == (20480, 4096)  # the paper's
    [term] = parse_rewards([{"name": "overlong", "max_length": 3}], max_tokens=16)
    assert term.cache_length == 1  # at least one token
    _, parts = RewardMix([{"name": "overlong", "cache_length": 4}], 12).score(
        ["", "", ""], ["", "", ""], ["", "", ""], [8, 10, 12]
    )
    assert parts["overlong"] == [0.0, -0.5, -1.0]


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            {"name": "overlong", "cache_length": 9, "max_length": 8},
            "must be between 1 and max_length",
        ),
        ({"name": "overlong", "cache_length": 0}, "cache_length must be >= 1"),
        ({"name": "overlong", "cache_length": 2, "threshold": 3}, "only 'length' takes threshold"),
        (
            {"name": "length", "threshold": 3, "cache_length": 2},
            "only 'overlong' takes cache_length",
        ),
        (
            {"name": "exact_match", "max_length": 3},
            "only 'overlong' and 'reward_model' take max_length",
        ),
    ],
)
def test_bad_settings_are_refused_with_the_reason(entry, problem):
    with pytest.raises(ValueError, match=problem):
        parse_rewards([entry], max_tokens=16)


def test_overlong_alone_names_the_list_entry_it_needs():
    with pytest.raises(
        ValueError,
        match=re.escape('needs its lengths: use a reward list entry {name="overlong"'),
    ):
        check_reward_spec("overlong")
