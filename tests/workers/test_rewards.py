"""Rewards come only from the built-ins, ``regex:`` (RE2) and what the operator registered;
a registered reward runs in a child process and a stuck one is rejected as ``reward_timeout``."""

import sys

import pytest

from core_engine.rl.rewards import check_reward_spec, resolve_reward
from db import BatchStatus, JobStatus
from tests.workers.helpers import REGISTERED_REWARDS, train_config
from workers.jobs import run_job
from workers.specs import SpecError, validate

CODE_RUNNERS = ["os:system", "subprocess:run", "builtins:eval", "pty:spawn", "a.b:c"]


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """A module whose import leaves a file behind (nothing may import it)."""
    witness = tmp_path / "imported"
    (tmp_path / "rlwb_canary.py").write_text(
        f"open({str(witness)!r}, 'w').close()\ndef fn(c, r, p):\n    return [1.0] * len(c)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return witness


@pytest.mark.parametrize("spec", [*CODE_RUNNERS, "rlwb_canary:fn"])
def test_a_job_cannot_name_code_to_import(spec, canary, tiny_model):
    with pytest.raises(SpecError, match="not allowed"):
        validate("train", train_config(tiny_model, reward=spec))
    with pytest.raises(ValueError, match="not allowed"):
        resolve_reward(spec)
    assert not canary.exists() and "rlwb_canary" not in sys.modules


def test_the_worker_refuses_what_validation_would_have(repo, settings, tiny_model, canary):
    """A row written past the validation (an old client, a hand-made job file) fails on the
    worker without importing anything."""
    for spec, why in [("rlwb_canary:fn", "not allowed"), ("canary", "not registered")]:
        job = repo.create_job("train", train_config(tiny_model, reward=spec), total_steps=3)
        assert run_job(repo, job.id, settings).status == "failed"
        info = repo.get_job(job.id)
        assert info.status is JobStatus.FAILED and why in info.error
    assert not canary.exists() and "rlwb_canary" not in sys.modules


def test_registered_names_pass_the_syntax_check_and_need_the_worker(monkeypatch, canary):
    check_reward_spec("canary")  # the UI can't know the worker's registrations
    with pytest.raises(ValueError, match="not registered"):
        resolve_reward("canary")
    monkeypatch.setenv("RLWB_REWARDS", "canary=rlwb_canary:fn")
    reward = resolve_reward("canary")
    assert reward(["a", "b"], ["", ""], ["", ""]) == [1.0, 1.0]
    assert canary.exists() and "rlwb_canary" not in sys.modules  # imported in the child
    reward.close()


def test_regex_rewards_run_in_linear_time():
    """`(\\d+)+x` backtracks exponentially in Python's `re`; RE2 answers at once."""
    reward = resolve_reward(r"regex:(\d+)+x")
    assert reward(["1" * 100_000, "12x"], ["", ""], ["", ""]) == [0.0, 1.0]
    with pytest.raises(ValueError, match="RE2"):
        check_reward_spec(r"regex:(a)\1")


def test_a_stuck_reward_rejects_the_batch_as_reward_timeout(
    repo, settings, tiny_model, monkeypatch
):
    monkeypatch.setenv("RLWB_REWARDS", REGISTERED_REWARDS)
    monkeypatch.setenv("RLWB_REWARD_TIMEOUT", "1")
    config = train_config(tiny_model, steps=2, reward="stuck", max_consecutive_rejections=1)
    job = repo.create_job("train", config, total_steps=2)

    assert run_job(repo, job.id, settings).status == "failed"

    info = repo.get_job(job.id)
    assert "reward_timeout" in info.error and info.current_version == 0
    batches = repo.list_batches(job.id)
    assert len(batches) == 2 and {b.status for b in batches} == {BatchStatus.REJECTED}
    assert all("reward_timeout" in " ".join(b.rejection_reasons) for b in batches)


def test_installed_packages_register_rewards_by_entry_point(monkeypatch, canary):
    from importlib.metadata import EntryPoint

    from core_engine.rl import rewards

    installed = {
        rewards.ENTRY_POINT_GROUP: [EntryPoint("canary", "rlwb_canary:fn", "rlwb.rewards")]
    }
    monkeypatch.setattr(rewards, "entry_points", lambda group: installed.get(group, []))
    assert rewards.registered_rewards() == {"canary": "rlwb_canary:fn"}
    reward = resolve_reward("canary")
    assert reward(["a"], [""], [""]) == [1.0] and "rlwb_canary" not in sys.modules
    reward.close()
