"""A job killed at any point of a step resumes without gaps, duplicates or half batches.

A kill is simulated by a `BaseException` raised inside a repository write (nothing catches
it, as nothing survives SIGKILL); running the job again is the redelivery.
"""

import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from db import JobStatus
from tests.workers.helpers import assert_consistent, samples_in_db, train_config
from workers.jobs import Stop, run_job

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


@contextmanager
def killed_at_statement(repo, prefix, occurrence):
    """Expect the worker to be killed as it sends the ``occurrence``-th statement starting
    with ``prefix`` (inside a transaction: what it wrote before is never committed)."""
    seen = []

    def kill(connection, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith(prefix.upper()):
            seen.append(statement)
            if len(seen) == occurrence:
                raise Killed

    sa.event.listen(repo.engine, "before_cursor_execute", kill)
    try:
        with pytest.raises(Killed):
            yield
    finally:
        sa.event.remove(repo.engine, "before_cursor_execute", kill)


def checkpoint(settings, job_id, version):
    return settings.jobs_dir / str(job_id) / f"version-{version:05d}"


def test_killed_after_the_checkpoint_before_the_step_redoes_the_step(
    repo, settings, job, monkeypatch
):
    kill_once(
        monkeypatch, repo, "record_step", lambda b, version, **_: version and version.version == 3
    )
    with pytest.raises(Killed):
        run_job(repo, job.id, settings)
    assert checkpoint(settings, job.id, 3).is_dir()  # written, but its step never was
    assert repo.latest_version(job.id).version == 2
    assert [b.step for b in repo.list_batches(job.id)] == [0, 1]
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert_consistent(repo, job.id, STEPS, SAMPLES)


def test_killed_inside_the_step_transaction_keeps_nothing_of_the_step(repo, settings, job):
    """Killed as the version row is written, after the step's batch and samples were sent."""
    with killed_at_statement(repo, "INSERT INTO policy_versions", occurrence=3):  # version 2
        run_job(repo, job.id, settings)
    assert repo.latest_version(job.id).version == 1
    assert [b.step for b in repo.list_batches(job.id)] == [0]
    assert samples_in_db(repo, job.id) == SAMPLES
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert_consistent(repo, job.id, STEPS, SAMPLES)


def test_killed_after_the_step_committed_resumes_after_it(repo, settings, job, monkeypatch):
    kill_once(monkeypatch, repo, "update_progress", lambda job_id, step, total, **_: step == 2)
    run_killed_then_resumed(repo, settings, job.id)
    assert_consistent(repo, job.id, STEPS, SAMPLES)
    assert len(repo.list_batches(job.id)) == STEPS  # no step was redone


def test_an_interrupted_checkpoint_rename_is_finished(repo, settings, job, monkeypatch):
    kill_once(monkeypatch, repo, "update_progress", lambda job_id, step, total, **_: step == 2)
    with pytest.raises(Killed):
        run_job(repo, job.id, settings)
    final = checkpoint(settings, job.id, 2)
    final.rename(final.with_name("version-00002.tmp"))  # died between rmtree and rename
    assert run_job(repo, job.id, settings).status == "succeeded"
    assert_consistent(repo, job.id, STEPS, SAMPLES)


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_stale_owners_checkpoint_commit_is_refused(repo, settings, job, monkeypatch):
    """Attempt A freezes just before committing its first checkpoint; recovery gives the job
    to attempt B, which runs it to the end. When A wakes up its commit is refused, and B's
    checkpoint of the same version is left exactly as B wrote it."""
    owning, after_b = repo.owning, {}

    def frozen_once(job_id, fence):
        if not after_b:  # A, frozen: the job is taken from it and B runs it
            after_b["fence"] = fence
            after_b["outcome"] = run_job(repo, job_id, settings)
            after_b["files"] = _files(checkpoint(settings, job_id, 1))
        return owning(job_id, fence)

    monkeypatch.setattr(repo, "owning", frozen_once)
    outcome = run_job(repo, job.id, settings)

    assert after_b["outcome"].status == "succeeded"
    assert outcome.status == "interrupted" and outcome.stop is Stop.LOST
    assert _files(checkpoint(settings, job.id, 1)) == after_b["files"]
    assert [p.name for p in checkpoint(settings, job.id, 1).parent.glob("*.tmp*")] == []
    info = repo.get_job(job.id)
    assert info.status is JobStatus.SUCCEEDED and info.attempts == 2
    assert_consistent(repo, job.id, STEPS, SAMPLES)


def test_checkpoints_of_another_run_are_refused(repo, settings, tiny_model, tmp_path):
    output = tmp_path / "reused"
    first = repo.create_job("train", train_config(tiny_model, steps=1, output_dir=str(output)))
    run_job(repo, first.id, settings)

    second = repo.create_job("train", train_config(tiny_model, steps=1, output_dir=str(output)))
    assert run_job(repo, second.id, settings).status == "failed"
    assert "holds checkpoints of another run" in repo.get_job(second.id).error


def test_a_recorded_version_without_its_checkpoint_is_refused(repo, settings, job, monkeypatch):
    kill_once(
        monkeypatch, repo, "record_step", lambda b, version, **_: version and version.version == 3
    )
    with pytest.raises(Killed):
        run_job(repo, job.id, settings)
    for path in Path(settings.jobs_dir / str(job.id)).glob("version-*"):
        shutil.rmtree(path)
    assert run_job(repo, job.id, settings).status == "failed"
    assert "checkpoint of recorded version 2 is missing" in repo.get_job(job.id).error


def test_an_evaluation_killed_inside_its_write_stores_its_samples_once(repo, settings, tiny_model):
    train = repo.create_job("train", train_config(tiny_model, steps=1))
    run_job(repo, train.id, settings)
    config = {"job_id": train.id, "version": 1, "task": "always7", "num_prompts": 3}
    job = repo.create_job("evaluate", config)
    with killed_at_statement(repo, "INSERT INTO policy_versions", occurrence=1):
        run_job(repo, job.id, settings)
    assert repo.list_batches(job.id) == [] and repo.list_versions(job.id) == []
    assert run_job(repo, job.id, settings).status == "succeeded"
    [batch] = repo.list_batches(job.id)
    assert batch.num_samples == samples_in_db(repo, job.id) == 3
    assert [v.version for v in repo.list_versions(job.id)] == [1]


def test_rejected_batches_after_the_last_version_are_replaced_by_the_retry(
    repo, settings, tiny_model, monkeypatch
):
    """Every batch is rejected (no reward variance), so none advances the version: after a
    crash, the retry redoes them with the same seeds and stores each once."""
    config = train_config(tiny_model, steps=4, drop_zero_variance_groups=True)
    job = repo.create_job("train", {**config, "max_consecutive_rejections": 3}, total_steps=4)
    stored = []
    kill_once(
        monkeypatch,
        repo,
        "record_step",
        lambda b, version, **_: version is None and len(stored.append(1) or stored) == 3,
    )
    with pytest.raises(Killed):
        run_job(repo, job.id, settings)
    assert len(repo.list_batches(job.id)) == 2
    assert run_job(repo, job.id, settings).status == "stalled"  # nothing to learn
    batches = repo.list_batches(job.id)
    assert len(batches) == 4 and {b.status for b in batches} == {"rejected"}
    assert samples_in_db(repo, job.id) == 4 * SAMPLES  # not 6 batches: the 2 were replaced


def stored_batches(repo, job_id):
    """Each stored batch's status and its samples' prompts and seeds, in the order stored."""
    with repo.engine.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT b.status, s.prompt_text, s.seed FROM rollout_batches b JOIN samples s "
                "ON s.batch_id = b.id WHERE b.job_id = :job ORDER BY b.id, s.id"
            ),
            {"job": job_id},
        ).all()
    return [tuple(row) for row in rows]


def test_a_stop_after_rejected_batches_keeps_them_and_resumes_after_them(
    repo, settings, tiny_model
):
    """Every batch is filtered (no reward variance). A cancel after the second one, then a
    resume: the stored batches, their samples and the stall equal the straight run's (the
    rejected rows are neither deleted and lost nor redone twice, and the stall count goes on)."""
    config = {
        **train_config(tiny_model, steps=4, drop_zero_variance_groups=True),
        "max_consecutive_rejections": 3,
    }
    straight = repo.create_job("train", config, total_steps=4)
    assert run_job(repo, straight.id, settings).status == "stalled"
    expected = stored_batches(repo, straight.id)
    assert len(expected) == 4 * SAMPLES  # stalled after the 4th filtered batch

    job = repo.create_job("train", config, total_steps=4)
    rejected = []

    def cancel_after_two_rejections(meta):
        if meta.get("batch") == "rejected" and len(rejected.append(1) or rejected) == 2:
            repo.request_cancel(job.id)

    outcome = run_job(repo, job.id, settings, progress=cancel_after_two_rejections)
    assert outcome.status == "cancelled" and len(repo.list_batches(job.id)) == 2
    repo.reopen(job.id)
    assert run_job(repo, job.id, settings).status == "stalled"
    assert stored_batches(repo, job.id) == expected
