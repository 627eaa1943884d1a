"""A job on the built-in demo model starts from the policy shipped in the repository at once:
no warm-up, its version 0 is those weights (checksum as the shipped metadata records), and a
missing policy is a clear error, not a build."""

import json

import pytest

from core_engine.assets import CALCULATOR_POLICY
from core_engine.policies.calculator import INFO_FILE as CALCULATOR_INFO
from core_engine.policies.demo import INFO_FILE, SHIPPED_POLICY
from db import SampleFilter
from tests.workers.helpers import train_config
from workers import shipped
from workers.job_files import DemoPolicyMissing, resolve_model
from workers.jobs import run_job


def test_a_demo_job_trains_from_the_shipped_policy(repo, settings):
    config = train_config("demo", task="addition", steps=2, batch_size=4, group_size=4)
    config.update(max_tokens=6, heldout_every=0)
    job = repo.create_job("train", config, total_steps=2)
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert repo.get_job(job.id).phase is None  # the loading phase ended with the steps
    first, *rest = repo.list_versions(job.id)
    assert first.version == 0 and len(rest) == 2
    assert first.checkpoint_path == str(SHIPPED_POLICY)
    shipped = json.loads((SHIPPED_POLICY / INFO_FILE).read_text())
    assert first.weights_checksum == shipped["weights_checksum"]
    assert not (settings.data_dir / "demo-policy").exists()  # nothing was built


def test_a_calculator_demo_job_runs_episodes_from_the_shipped_calculator_policy(repo, settings):
    """`calculator-demo` names the shipped calculator policy: its job starts from those weights
    and stores multi-turn episodes against the calculator environment."""
    config = train_config("calculator-demo", task="word_problems", steps=1, batch_size=2)
    config.update(environment="calculator", max_tokens=48, max_turns=5, max_episode_tokens=384)
    job = repo.create_job("train", {**config, "heldout_every": 0}, total_steps=1)
    assert run_job(repo, job.id, settings).status == "succeeded"
    first = repo.list_versions(job.id)[0]
    assert first.checkpoint_path == str(CALCULATOR_POLICY)
    shipped = json.loads((CALCULATOR_POLICY / CALCULATOR_INFO).read_text())
    assert first.weights_checksum == shipped["weights_checksum"]
    samples = repo.list_samples(SampleFilter(job.id), limit=10).items
    assert len(samples) == 4
    details = [repo.get_sample(s.id) for s in samples]
    assert all(d.segments and d.segments[0]["role"] == "assistant" for d in details)
    assert any(call["name"] == "calculate" for d in details for call in d.segments[0]["tool_calls"])


def test_a_missing_shipped_policy_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(shipped.SHIPPED_POLICIES, "demo", tmp_path / "gone")
    with pytest.raises(
        DemoPolicyMissing, match=r"rebuild it with `python -m core_engine\.policies\.demo`"
    ):
        resolve_model("demo")
    assert resolve_model(str(tmp_path)) == str(tmp_path)  # a directory stays itself
