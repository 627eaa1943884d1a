"""Fencing tokens, heartbeats and recovery: once a job is taken from an owner, nothing that
owner sends is stored; a retried step replaces what the interrupted attempt stored."""

import threading

import pytest

from db import JobStatus, PolicyVersionRecord, SampleFilter, StaleOwner

from .helpers import make_batch, make_sample


def started(repo, task_id="task-1"):
    job = repo.create_job("train", {"model": "toy"})
    repo.set_celery_task_id(job.id, task_id)
    attempt = repo.start_attempt(job.id, task_id)
    repo.mark_running(job.id, fence=attempt.fence)
    return attempt


def version(job_id, v):
    return PolicyVersionRecord(job_id, v, parent_version=v - 1 if v else None)


def test_every_write_of_a_stale_owner_is_refused_and_the_new_owner_is_unaffected(repo):
    old = started(repo)
    repo.record_step([], version(old.id, 0), fence=old.fence)
    # the old owner goes silent; recovery takes the job and a new attempt starts
    taken = repo.requeue_stale(old.id, 0, "task-2")
    assert taken.status is JobStatus.QUEUED and taken.fence > old.fence
    new = repo.start_attempt(old.id, "task-2")
    repo.mark_running(old.id, fence=new.fence)

    samples = [make_sample(0, g) for g in range(2)]
    writes = [
        lambda f: repo.record_step([make_batch(old.id, samples)], version(old.id, 1), fence=f),
        lambda f: repo.record_batch(make_batch(old.id, samples), fence=f),
        lambda f: repo.record_policy_version(version(old.id, 1), fence=f),
        lambda f: repo.update_progress(old.id, 1, fence=f),
        lambda f: repo.heartbeat(old.id, f),
        lambda f: repo.mark_failed(old.id, "old owner", fence=f),
        lambda f: repo.discard_unversioned(old.id, 0, f),
    ]
    for write in writes:
        with pytest.raises(StaleOwner):
            write(old.fence)
    assert repo.list_batches(old.id) == [] and repo.latest_version(old.id).version == 0

    repo.record_step([make_batch(old.id, samples)], version(old.id, 1), fence=new.fence)
    assert repo.mark_succeeded(old.id, fence=new.fence).status is JobStatus.SUCCEEDED


def test_while_an_owner_acts_as_owner_no_new_attempt_can_take_the_job(repo):
    """`owning` (a checkpoint commit): recovery and a new attempt wait for the block; then
    the old owner is refused."""
    old = started(repo)
    taken = []
    with repo.owning(old.id, old.fence):
        thread = threading.Thread(target=lambda: taken.append(repo.start_attempt(old.id)))
        thread.start()
        thread.join(0.5)
        assert thread.is_alive() and taken == []
    thread.join(30)
    assert taken[0].fence == old.fence + 1
    with pytest.raises(StaleOwner), repo.owning(old.id, old.fence):
        pytest.fail("a stale owner ran as owner")


def test_recovery_takes_only_jobs_without_a_recent_heartbeat(repo):
    job = started(repo)
    assert repo.requeue_stale(job.id, 60, "task-2") is None
    assert repo.heartbeat(job.id, job.fence).heartbeat_at is not None
    assert repo.get_job(job.id).celery_task_id == "task-1"
    # another task cannot start a job it does not own
    with pytest.raises(Exception, match="be started by task"):
        repo.start_attempt(job.id, "task-9")


def test_a_clean_hand_back_costs_no_attempt_and_is_requeued_at_once(repo):
    job = started(repo)
    released = repo.release(job.id, job.fence)
    assert released.attempts == 0 and released.heartbeat_at is None
    with pytest.raises(StaleOwner):
        repo.update_progress(job.id, 1, fence=job.fence)
    taken = repo.requeue_stale(job.id, 60, "task-2")
    assert taken.status is JobStatus.QUEUED and taken.celery_task_id == "task-2"


def test_a_cancelling_job_whose_owner_died_is_cancelled_not_requeued(repo):
    job = started(repo)
    repo.request_cancel(job.id)
    taken = repo.requeue_stale(job.id, 0, "task-2")
    assert taken.status is JobStatus.CANCELLED and taken.celery_task_id == "task-1"


def test_rejected_batches_after_the_resumed_version_are_replaced_not_added(repo):
    job = started(repo)
    f = job.fence
    repo.record_step([], version(job.id, 0), fence=f)
    accepted = make_batch(job.id, [make_sample(0, g) for g in range(2)], step=0)
    repo.record_step([accepted], version(job.id, 1), fence=f)
    for step in (1, 1, 2):  # rejected after version 1's checkpoint, then a crash
        bad = [make_sample(step, g, version=1, reward=0.0) for g in range(2)]
        repo.record_step(
            [make_batch(job.id, bad, version=1, step=step, status="rejected", reasons=("x",))],
            None,
            fence=f,
        )

    retry = repo.start_attempt(job.id, "task-1")
    assert repo.discard_unversioned(job.id, 1, retry.fence) == 3
    batches = repo.list_batches(job.id)
    assert [(b.step, b.status) for b in batches] == [(0, "accepted")]
    assert len(repo.list_samples(SampleFilter(job.id)).items) == 2
    metrics = {m.version: m for m in repo.version_metrics(job.id)}
    assert metrics[0].num_samples == 2
    assert 1 not in metrics or metrics[1].num_samples == 0
