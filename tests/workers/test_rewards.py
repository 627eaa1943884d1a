"""Rewards come only from the built-ins, ``regex:`` (RE2) and what the operator registered;
a registered reward runs in a child process and a stuck one is rejected as ``reward_timeout``."""

import json
import sys

import pytest

from core_engine.rl.rewards import check_reward_spec, resolve_reward
from db import BatchStatus, JobStatus, SampleFilter
from tests.workers.helpers import REGISTERED_REWARDS, train_config
from workers import commands
from workers.jobs import run_job
from workers.specs import SpecError, validate
from workers.submission import validate_job

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
    config["heldout_every"] = 0  # held-out scoring at version 0 would time out first
    job = repo.create_job("train", config, total_steps=2)

    assert run_job(repo, job.id, settings).status == "failed"

    info = repo.get_job(job.id)
    assert "reward_timeout" in info.error and info.current_version == 0
    batches = repo.list_batches(job.id)
    assert len(batches) == 2 and {b.status for b in batches} == {BatchStatus.REJECTED}
    assert all("reward_timeout" in " ".join(b.rejection_reasons) for b in batches)


def test_installed_packages_register_rewards_by_entry_point(monkeypatch, canary):
    from importlib.metadata import EntryPoint

    from core_engine.rl import registry, rewards

    installed = {
        rewards.ENTRY_POINT_GROUP: [EntryPoint("canary", "rlwb_canary:fn", "rlwb.rewards")]
    }
    monkeypatch.setattr(registry, "entry_points", lambda group: installed.get(group, []))
    assert rewards.registered_rewards() == {"canary": "rlwb_canary:fn"}
    reward = resolve_reward("canary")
    assert reward(["a"], [""], [""]) == [1.0] and "rlwb_canary" not in sys.modules
    reward.close()


def test_a_reward_list_stores_each_component_per_sample_and_per_version(repo, settings, tiny_model):
    rewards = [
        {"name": "exact_match", "weight": 1.0},
        {"name": "regex:.*", "weight": 0.5},
        {"name": "length", "weight": 0.25, "threshold": 2},
    ]
    config = train_config(tiny_model, steps=1, reward=rewards, heldout_every=0)
    validate_job("train", config)
    job = repo.create_job("train", config, total_steps=1)
    assert run_job(repo, job.id, settings).status == "succeeded"

    samples = repo.list_samples(SampleFilter(job_id=job.id)).items
    assert samples
    for summary in samples:
        sample = repo.get_sample(summary.id)
        parts = sample.reward_components
        assert set(parts) == {"exact_match", "regex:.*", "length"} and parts["regex:.*"] == 1.0
        tokens = len(sample.response_token_ids)  # max_tokens 4: 0 up to 2, -1 at 4
        assert parts["length"] == pytest.approx(max(-1.0, min(0.0, (2 - tokens) / 2)))
        total = parts["exact_match"] + 0.5 * parts["regex:.*"] + 0.25 * parts["length"]
        assert sample.reward == pytest.approx(total)
    extra = repo.get_version(job.id, 1).metrics.extra
    assert extra["reward/regex:.*/mean"] == 1.0 and extra["reward/regex:.*/std"] == 0.0
    lengths = [repo.get_sample(s.id).reward_components["length"] for s in samples]
    assert extra["reward/length/mean"] == pytest.approx(sum(lengths) / len(lengths))


def test_a_reward_list_is_refused_at_submission_with_the_reason(tiny_model):
    config = train_config(tiny_model, heldout_every=0)
    with pytest.raises(SpecError, match=r"threshold \(4\) must be below max_tokens \(4\)"):
        validate("train", {**config, "reward": [{"name": "length", "threshold": 4}]})
    with pytest.raises(SpecError, match="at most 8"):
        validate("train", {**config, "reward": [{"name": "math"}] * 9})


# Issue 32, item 1: every sample would score 0, no group has anything to learn: it would stall.
def test_a_reward_list_whose_weights_are_all_zero_is_refused_from_a_job_file(
    repo, tmp_path, capsys
):
    job = tmp_path / "job.toml"
    head = 'model = "demo"\ntask = "addition"\nmax_tokens = 6\nsteps = 2\n'
    job.write_text(head + 'reward = [{name = "math", weight = 0}, {name = "format", weight = 0.0}]')
    assert commands.main(["submit", str(job)]) == 1
    assert "every weight is 0" in capsys.readouterr().out and repo.list_jobs() == []
    job.write_text(head + 'reward = [{name = "math", weight = 0}, {name = "format", weight = 0.2}]')
    assert commands.main(["submit", str(job)]) == 0
    assert [e["weight"] for e in repo.list_jobs()[0].config["reward"]] == [0, 0.2]


def test_math_on_a_reference_that_hangs_sympy_rejects_the_batch_as_reward_timeout(
    repo, settings, tiny_model, tmp_path, monkeypatch
):
    """Expanding 10^10^10^10 never ends: the sandbox's limit rejects the batch cleanly."""
    monkeypatch.setenv("RLWB_REWARD_TIMEOUT", "3")
    data = tmp_path / "tower.jsonl"
    record = {"instruction": "Compute.", "output": r"\boxed{10^{10^{10^{10}}} + 1}"}
    data.write_text(json.dumps(record) + "\n")
    config = train_config(tiny_model, task=None, data=str(data), batch_size=1, steps=1)
    config.update(reward="math", max_consecutive_rejections=1)
    job = repo.create_job("train", config, total_steps=1)

    assert run_job(repo, job.id, settings).status == "failed"

    info = repo.get_job(job.id)
    assert "reward_timeout" in info.error and info.current_version == 0
    batches = repo.list_batches(job.id)
    assert batches and {b.status for b in batches} == {BatchStatus.REJECTED}
    assert all("reward_timeout" in " ".join(b.rejection_reasons) for b in batches)
