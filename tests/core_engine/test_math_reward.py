"""The `math` reward against a hand-written table of answer pairs, and its time limit: it
runs in the reward sandbox, so an input that makes sympy hang rejects the batch as
``reward_timeout`` and the next batch is scored by a fresh child."""

import pytest

from core_engine.rl.rewards import RewardError, resolve_reward
from core_engine.rl.rewards.math_reward import equivalent

# (completion, reference, equivalent?) -- written by hand, not read off math-verify.
PAIRS = [
    # the same number written differently
    ("0.5", r"\frac{1}{2}", True),
    (r"\frac{1}{2}", "0.5", True),
    ("1,000", "1000", True),
    ("1000", "1,000", True),
    ("50%", "0.5", True),
    ("x=3", "3", True),
    ("3", "x = 3", True),
    ("The answer is 42.", "42", True),
    ("#### 42", "42", True),
    ("so the total is\n#### 17", "17", True),
    (r"Therefore \boxed{7}", "7", True),
    (r"\boxed{\frac{3}{4}}", "0.75", True),
    (r"\boxed{\dfrac{6}{8}}", r"\frac{3}{4}", True),
    ("2/4", "1/2", True),
    ("-3", "-3", True),
    ("-0.25", r"-\frac{1}{4}", True),
    ("3.0", "3", True),
    ("3.50", "3.5", True),
    (r"$\sqrt{4}$", "2", True),
    (r"\boxed{2^{3}}", "8", True),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", True),
    ("First 5 apples, then 3 more: 8", "8", True),
    (r"\boxed{\pi}", r"\pi", True),
    (r"\boxed{x^2+2x+1}", "(x+1)^2", True),
    ("The answer is 12 cm", "12", True),
    (r"\boxed{10\%}", "0.1", True),
    (r"\boxed{(1, 2)}", "(1,2)", True),
    # different answers
    ("-3", "3", False),
    ("3", "-3", False),
    (r"-\frac{1}{2}", "0.5", False),
    ("0.5", r"\frac{1}{3}", False),
    ("1,001", "1000", False),
    ("x=4", "4.5", False),
    ("The answer is 41.", "42", False),
    ("#### 43", "42", False),
    (r"\boxed{\frac{4}{3}}", "0.75", False),
    (r"$\sqrt{5}$", "2", False),
    (r"\boxed{2^{4}}", "8", False),
    ("#### 1000", "The total is 100 + 900.\n#### 1000", True),
    (r"\boxed{x^2+1}", "(x+1)^2", False),
    (r"\boxed{(2, 1)}", "(1,2)", False),
    # nothing to compare
    ("I don't know", "42", False),
    ("", "42", False),
    ("no number here at all", "seven", False),
    ("42", "", False),
]

# (completion, reference, equivalent?) with an answer tag: its last tag is the answer.
TAGGED = [
    ("<answer>18</answer>", "18", True),
    ("<think>..</think><answer>18</answer>", "18", True),
    ("<think>3 bags of 6 apples</think>\n<answer>18</answer>", "18", True),  # `format`'s
    ("<think>6 + 6 + 6</think>\n<answer>\\boxed{18}</answer>", "18", True),
    ("<think>half of it</think> <answer>\\frac{1}{2}</answer>", "0.5", True),
    ("<answer>(x+1)^2</answer>", "x^2+2x+1", True),
    ("<answer>20</answer> no: <answer>18</answer>", "18", True),
    ("<think>it is 18</think><answer>20</answer>", "18", False),  # the reasoning is not read
    ("<think>it is 18</think><answer></answer>", "18", False),
    ("<think>it is 18</think><answer> </answer>", "18", False),
    ("<answer>18</answer> no: <answer>20</answer>", "18", False),
]


def test_the_last_answer_tag_is_the_answer():
    for completion, reference, want in TAGGED:
        assert equivalent(completion, reference) is want, completion


def test_the_table_is_large_and_balanced():
    assert len(PAIRS) >= 40
    assert sum(want for *_, want in PAIRS) >= 15 and sum(not w for *_, w in PAIRS) >= 15


@pytest.mark.parametrize(("completion", "reference", "want"), PAIRS)
def test_math_equivalence(completion, reference, want):
    assert equivalent(completion, reference) is want


def test_math_scores_in_the_sandbox_and_a_hang_times_out_cleanly(monkeypatch):
    monkeypatch.setenv("RLWB_REWARD_TIMEOUT", "20")
    reward = resolve_reward("math")
    try:
        assert reward([r"\boxed{0.5}", "3"], [r"\frac{1}{2}", "-3"], ["", ""]) == [1.0, 0.0]
        tagged = ["<think>9+9</think>\n<answer>18</answer>", "<think>18</think><answer>2</answer>"]
        assert reward(tagged, ["18", "18"], ["", ""]) == [1.0, 0.0]  # the answer tags
        reward.timeout = 2.0  # the child is warm: the limit now only covers the scoring
        with pytest.raises(RewardError, match="reward_timeout"):  # sympy expands the tower
            reward([r"\boxed{10^{10^{10^{10}}} + 1}"], ["3"], [""])
        reward.timeout = 20.0
        assert reward(["#### 1000"], ["1,000"], [""]) == [1.0]  # a fresh child
    finally:
        reward.close()
