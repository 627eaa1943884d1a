"""Several rewards per job: the list syntax and its checks, the weighted sum and its
components, the `format` template and DAPO's `length` penalty (expected values by hand)."""

import pytest

from core_engine.rl.config import GRPOConfig
from core_engine.rl.rewards import check_reward_spec, length_penalty, resolve_reward
from core_engine.rl.rewards.mix import RewardMix, RewardTerm, component_stats, parse_rewards


def test_a_single_spec_is_one_term_without_components():
    assert parse_rewards("exact_match") == [RewardTerm("exact_match")]
    mix = RewardMix("exact_match", max_tokens=8)
    assert mix.score(["a", "b"], ["a", "a"], ["", ""], [1, 1]) == ([1.0, 0.0], {})


def test_the_total_is_the_weighted_sum_of_the_components():
    spec = [
        {"name": "exact_match", "weight": 1.0},
        {"name": "regex:b+", "weight": 0.5},
        {"name": "length", "weight": 2.0, "threshold": 4},
    ]
    mix = RewardMix(spec, max_tokens=8)
    # exact, regex, length(tokens): 1+0+0 | 0+0.5+2*(-0.5) | 0+0.5+2*(-1)
    totals, parts = mix.score(["a", "bb", "b"], ["a", "a", "a"], [""] * 3, [3, 6, 9])
    assert parts == {
        "exact_match": [1.0, 0.0, 0.0],
        "regex:b+": [0.0, 1.0, 1.0],
        "length": [0.0, -0.5, -1.0],
    }
    assert totals == [1.0, -0.5, -1.5]


@pytest.mark.parametrize(
    ("length", "want"),
    [(0, 0.0), (384, 0.0), (385, -1 / 128), (448, -0.5), (512, -1.0), (600, -1.0)],
)
def test_length_penalty_is_dapos_soft_overlong_punishment(length, want):
    assert length_penalty([length], threshold=384, max_tokens=512) == [pytest.approx(want)]


@pytest.mark.parametrize(
    ("completion", "want"),
    [
        ("<think>2+2 is 4</think><answer>4</answer>", 1.0),
        ("  <think>\nsteps\n</think>\n\n<answer>4</answer>\n", 1.0),
        ("<answer>4</answer>", 0.0),
        ("<think>x</think>", 0.0),
        ("<answer>4</answer><think>x</think>", 0.0),
        ("<think>x</think><answer>4</answer> and more", 0.0),
        ("4", 0.0),
    ],
)
def test_format_checks_the_reasoning_template(completion, want):
    assert resolve_reward("format")([completion], [""], [""]) == [want]


def test_format_tags_are_configurable():
    mix = RewardMix([{"name": "format", "tags": ["reason", "final"]}], max_tokens=8)
    texts = ["<reason>r</reason><final>4</final>", "<think>r</think><answer>4</answer>"]
    assert mix.score(texts, ["", ""], ["", ""], [1, 1])[1] == {"format": [1.0, 0.0]}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "expected a name or a list"),
        ([{"name": "exact_match"}] * 9, "at most 8"),
        ([{"name": "exact_match"}, {"name": "exact_match"}], "at most once"),
        ([{"weight": 1.0}], "name needed"),
        ([{"name": "math", "scale": 2}], "keys are"),
        ([{"name": "math", "weight": float("nan")}], "finite"),
        ([{"name": "math", "weight": "1"}], "must be a number"),
        ([{"name": "math", "weight": 1000.0}], "<= 100"),
        ([{"name": "length"}], "needs a threshold"),
        ([{"name": "length", "threshold": 16}], "below max_tokens"),
        ([{"name": "length", "threshold": 2.5}], "whole number"),
        ([{"name": "math", "threshold": 4}], "only 'length'"),
        ([{"name": "math", "tags": ["a", "b"]}], "only 'format'"),
        ([{"name": "format", "tags": ["a"]}], "two names"),
        ([{"name": "format", "tags": ["a>", "b"]}], "two names"),
        ([{"name": "os:system"}], "not allowed"),
        ([{"name": "math", "weight": 0}, {"name": "format", "weight": 0.0}], "every weight is 0"),
        ([{"name": "exact_match", "weight": -0.0}], "every weight is 0"),
        ("length", "needs a threshold"),
        ({"name": "math"}, "expected a name or a list"),
    ],
)
def test_bad_reward_lists_are_refused_with_a_reason(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_rewards(spec, max_tokens=16)


def test_the_job_config_takes_a_list_and_checks_it_against_max_tokens():
    spec = [{"name": "math", "weight": 1.0}, {"name": "length", "weight": 0.5, "threshold": 8}]
    config = GRPOConfig(model="m", output_dir="o", task="always7", max_tokens=16, reward=spec)
    assert config.reward == spec
    with pytest.raises(ValueError, match="below max_tokens"):
        GRPOConfig(model="m", output_dir="o", task="always7", max_tokens=8, reward=spec)
    for name in ("math", "format"):
        check_reward_spec(name)


def test_component_stats_are_each_components_mean_and_population_std():
    stats = component_stats({"math": [1.0, 0.0, 1.0, 0.0], "format": [1.0, 1.0, 1.0, 1.0]})
    assert stats == {
        "reward/math/mean": 0.5,
        "reward/math/std": 0.5,
        "reward/format/mean": 1.0,
        "reward/format/std": 0.0,
    }
