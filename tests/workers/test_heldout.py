"""Held-out accuracy during training: stored with the due versions, equal to a fresh engine's
greedy score of the version's checkpoint on the same held-out prompts, none of them a training
prompt; bad settings are refused before the job is queued."""

import pytest

from core_engine.engine import load_engine
from core_engine.rl.tasks import prompt_records
from tests.workers.helpers import train_config
from workers.evaluation import HeldoutEval
from workers.jobs import run_job
from workers.specs import HeldoutSettings, SpecError, heldout_settings, validate


def test_heldout_accuracy_is_stored_every_n_versions(repo, settings, tmp_path):
    from core_engine.toy import save_tiny_checkpoint

    # the always7 alphabet: the tiny model learns to answer 7 in a few steps
    model = str(save_tiny_checkpoint(tmp_path / "tiny", alphabet="0123456789?=+"))
    config = train_config(
        model,
        steps=3,
        batch_size=4,
        group_size=8,
        max_tokens=2,
        lr=0.003,
        heldout_every=2,
        heldout_prompts=12,
        reward="regex:7",  # the job's reward; held-out accuracy is the task's exact match
    )
    job = repo.create_job("train", config, total_steps=3)
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert repo.get_job(job.id).phase is None
    versions = repo.list_versions(job.id)
    scored = {v.version: v.metrics.extra.get("heldout_accuracy") for v in versions}
    assert [v for v, acc in scored.items() if acc is not None] == [0, 2, 3]  # due + last

    records = prompt_records("always7", None, seed=0)
    heldout = HeldoutEval("always7", HeldoutSettings(2, 12), 2, records)
    assert len(heldout.records) == 12
    accuracies = set()
    for v in versions:
        if scored[v.version] is not None:
            engine = load_engine(v.checkpoint_path, policy_version=v.version)
            assert heldout.accuracy(engine) == pytest.approx(scored[v.version])
            accuracies.add(scored[v.version])
    assert len(accuracies) > 1  # it moved: a score of the weights, not a constant


def test_heldout_prompts_are_never_training_prompts_when_the_task_has_enough():
    records = prompt_records("addition", None, seed=0)
    heldout = HeldoutEval("addition", HeldoutSettings(10, 200), 6, records)
    assert len(heldout.records) == 200
    assert not {r["input"] for r in heldout.records} & {r["input"] for r in records}


def test_heldout_settings_are_checked_before_queueing(tiny_model):
    assert heldout_settings({"task": "addition"}).every == 10
    assert heldout_settings({"data": "x.jsonl"}).every == 0
    for bad, message in (
        ({"heldout_every": -1}, "heldout_every must be >= 0"),
        ({"heldout_prompts": 0}, "heldout_prompts must be >= 1"),
        ({"heldout_prompts": 2001}, "heldout_prompts must be <= 2,000"),
        ({"heldout_every": 2.5}, "heldout_every must be a whole number"),
    ):
        with pytest.raises(SpecError, match=message):
            validate("train", train_config(tiny_model, **bad))
    with pytest.raises(SpecError, match="needs a built-in task"):
        heldout_settings({"data": "x.jsonl", "heldout_every": 5})
