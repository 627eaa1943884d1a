"""The reward sandbox bounds memory as well as time (issue 32, item 6): the `math` reward
reached 1 GB on ``2^{2^{33}}``. The child's address space is limited, so such an input fails
in the child alone and the child goes on to the next batch."""

import pytest

from core_engine.rl.rewards import RewardError, resolve_reward
from core_engine.rl.rewards.sandbox import SandboxedReward

LIMIT = 512 << 20  # below what 2^(2^33) takes (1 GiB), far above the child's own ~70 MiB
TIMEOUT_S = "120"  # sympy's work here takes seconds; only a hang reaches it


def peak_address_space(reward: SandboxedReward) -> int:
    """The largest address space the reward's child has had (its VmPeak), in bytes."""
    with open(f"/proc/{reward._child.pid}/status") as status:
        line = next(line for line in status if line.startswith("VmPeak:"))
    return int(line.split()[1]) * 1024


def test_math_on_a_power_tower_stays_within_the_limit_and_the_child_goes_on(monkeypatch):
    monkeypatch.setenv("RLWB_REWARD_MEMORY", str(LIMIT))
    monkeypatch.setenv("RLWB_REWARD_TIMEOUT", TIMEOUT_S)
    reward = resolve_reward("math")
    try:
        # math-verify reads an evaluation that failed (here: out of memory) as no answer
        assert reward([r"\boxed{2^{2^{33}}}"], ["3"], [""]) == [0.0]
        child = reward._child.pid
        assert peak_address_space(reward) <= LIMIT
        assert reward([r"\boxed{0.5}"], [r"\frac{1}{2}"], [""]) == [1.0]
        assert reward._child.pid == child  # the same child: nothing restarted
    finally:
        reward.close()


def test_a_reward_that_lets_the_memory_error_through_fails_its_batch(tmp_path, monkeypatch):
    (tmp_path / "rlwb_greedy.py").write_text(
        "def fn(c, r, p):\n"
        f"    if c[0] == 'more':\n        bytearray({2 * LIMIT})\n"
        "    return [1.0] * len(c)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLWB_REWARDS", "greedy=rlwb_greedy:fn")
    monkeypatch.setenv("RLWB_REWARD_MEMORY", str(LIMIT))
    monkeypatch.setenv("RLWB_REWARD_TIMEOUT", TIMEOUT_S)
    reward = resolve_reward("greedy")
    try:
        with pytest.raises(
            RewardError, match=f"MemoryError: over its memory limit of {LIMIT:,} bytes"
        ):
            reward(["more"], [""], [""])
        child = reward._child.pid
        assert reward(["less"], [""], [""]) == [1.0]
        assert reward._child.pid == child  # the same child answered the next batch
    finally:
        reward.close()
