"""A registered reward's time limit covers the whole call, in a real child process: writing
the request (a child that does not read blocks a large one on the pipe), the function and
reading the reply (issue 24, item 4)."""

import os

import pytest

from core_engine.rl.rewards.sandbox import RewardError, SandboxedReward

LIMIT_S = 3.0  # the child starts in ~30 ms here: it is importing long before the limit
IMPORT_S = 60  # the child's import: 20x the limit
BIG = ["x" * 1_000_000] * 8  # 8 MB of completions: far more than a pipe's buffer


@pytest.fixture
def reward_module(tmp_path, monkeypatch):
    """Write a module the child can import; returns its ``module:fn`` target."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source)
        return f"{name}:fn"

    return write


def test_the_limit_covers_writing_a_request_the_child_does_not_read(reward_module, tmp_path):
    """The child is still importing (60 s) when 8 MB arrive: a 3 s limit used to block on
    the write until the import ended. Judged by the child's state, not by a clock: the call
    gave up while the import was still going on (it leaves a mark when it ends)."""
    pid_file, imported = tmp_path / "pid", tmp_path / "imported"
    target = reward_module(
        "rlwb_slow_import",
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        f"time.sleep({IMPORT_S})\nopen({str(imported)!r}, 'w').close()\n"
        "def fn(c, r, p):\n    return [1.0] * len(c)\n",
    )
    reward = SandboxedReward(target, timeout=LIMIT_S)
    with pytest.raises(RewardError, match="reward_timeout"):
        reward(BIG, [""] * len(BIG), [""] * len(BIG))
    assert not imported.exists(), "the call waited for the child's import to end"
    with pytest.raises(ProcessLookupError):  # the child was killed (and reaped)
        os.kill(int(pid_file.read_text()), 0)


def test_a_large_request_to_a_quick_reward_is_answered(reward_module):
    reward = SandboxedReward(
        reward_module("rlwb_length", "def fn(c, r, p):\n    return [len(x) for x in c]\n"),
        timeout=30,
    )
    try:
        assert reward(BIG, [""] * len(BIG), [""] * len(BIG)) == [1e6] * len(BIG)
        assert reward(["ab"], [""], [""]) == [2.0]  # the same child, the next batch
    finally:
        reward.close()


def test_the_child_starts_without_runpys_warning(reward_module, capfd):
    """The child imports its entry point once (it is not its package's module run again as
    `__main__`): its stderr, which the worker's log receives, has no RuntimeWarning."""
    target = reward_module("rlwb_plain", "def fn(c, r, p):\n    return [1.0]\n")
    reward = SandboxedReward(target, timeout=60)
    try:
        assert reward(["a"], ["a"], ["p"]) == [1.0]
    finally:
        reward.close()
    assert "RuntimeWarning" not in capfd.readouterr().err
