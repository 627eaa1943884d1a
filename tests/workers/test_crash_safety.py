"""A job killed at any point of a step resumes without gaps, duplicates or half batches.

A kill is simulated by a `BaseException` raised inside a repository write (nothing catches
it, as nothing survives SIGKILL); running the job again is the redelivery.
"""

import json
import shutil
from pathlib import Path

import pytest

from db import JobStatus
from tests.workers.helpers import assert_consistent, train_config
from workers import checkpoints, training
from workers.jobs import run_job

STEPS = 4
SAMPLES = 4  # batch_size 2 x group_size 2


class Killed(BaseException):
    """The worker process died here."""


def kill_once(monkeypatch, target, name, when):
    original = getattr(target, name)
    fired = []

    def wrapper(*args, **kwargs):
        if not fired and when(*args, **kwargs):
            fired.append(True)
            raise Killed
        return original(*args, **kwargs)

    monkeypatch.setattr(target, name, wrapper)


def run_killed_then_resumed(repo, settings, job_id):
    with pytest.raises(Killed):
        run_job(repo, job_id, settings)
    assert repo.get_job(job_id).status is JobStatus.RUNNING
    assert run_job(repo, job_id, settings).status == "succeeded"
    info = repo.get_job(job_id)
    assert info.attempts == 2 and info.current_version == STEPS


@pytest.fixture
def job(repo, tiny_model):
    return repo.create_job("train", train_config(tiny_model, steps=STEPS), total_steps=STEPS)


def test_killed_before_the_batch_committed_redoes_the_step(repo, settings, job, monkeypatch):
    kill_once(monkeypatch, repo, "record_batch", lambda batch: batch.step == 2)
    run_killed_then_resumed(repo, settings, job.id)
    assert_consistent(repo, job.id, STEPS, SAMPLES)


def test_killed_between_batch_and_version_rederives_the_version(repo, settings, job, monkeypatch):
    kill_once(monkeypatch, repo, "record_policy_version", lambda record: record.version == 3)
    with pytest.raises(Killed):
        run_job(repo, job.id, settings)
    note = json.loads(
        (settings.jobs_dir / str(job.id) / "version-00003" / checkpoints.NOTE_FILE).read_text()
    )
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert_consistent(repo, job.id, STEPS, SAMPLES)
    v3 = repo.list_versions(job.id)[3]
    assert v3.weights_checksum == note["weights_checksum"]
    assert v3.metrics.loss == note["metrics"]["loss"]


def test_killed_after_the_checkpoint_before_its_note(repo, settings, job, monkeypatch):
    kill_once(monkeypatch, training, "write_version_note", lambda record: record.version == 2)
    run_killed_then_resumed(repo, settings, job.id)
    assert_consistent(repo, job.id, STEPS, SAMPLES)


def test_an_interrupted_checkpoint_rename_is_finished(repo, settings, job, monkeypatch):
    kill_once(monkeypatch, repo, "record_policy_version", lambda record: record.version == 2)
    with pytest.raises(Killed):
        run_job(repo, job.id, settings)
    final = settings.jobs_dir / str(job.id) / "version-00002"
    final.rename(final.with_name("version-00002.tmp"))  # died between rmtree and rename
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert_consistent(repo, job.id, STEPS, SAMPLES)


def test_checkpoints_of_another_run_are_refused(repo, settings, tiny_model, tmp_path):
    output = tmp_path / "reused"
    first = repo.create_job("train", train_config(tiny_model, steps=1, output_dir=str(output)))
    run_job(repo, first.id, settings)

    second = repo.create_job("train", train_config(tiny_model, steps=1, output_dir=str(output)))
    assert run_job(repo, second.id, settings).status == "failed"
    assert "holds checkpoints of another run" in repo.get_job(second.id).error


def test_a_recorded_version_without_its_checkpoint_is_refused(repo, settings, job, monkeypatch):
    kill_once(monkeypatch, repo, "record_batch", lambda batch: batch.step == 2)
    with pytest.raises(Killed):
        run_job(repo, job.id, settings)
    for path in Path(settings.jobs_dir / str(job.id)).glob("version-*"):
        shutil.rmtree(path)
    assert run_job(repo, job.id, settings).status == "failed"
    assert "checkpoint of recorded version 2 is missing" in repo.get_job(job.id).error
