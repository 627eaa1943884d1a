from dataclasses import FrozenInstanceError

import pytest
import sqlalchemy as sa

from db import (
    InvalidTransition,
    InvalidValue,
    JobKind,
    JobNotFound,
    JobStatus,
    PolicyVersionRecord,
    Repository,
    StaleOwner,
)
from db.models import PolicyVersion, RolloutBatch, Sample, VersionSampleStats

from .helpers import make_batch, make_sample, running_job


def test_create_and_get_job(repo: Repository) -> None:
    created = repo.create_job("train", {"model": "qwen", "lr": 1e-6}, total_steps=10)
    job = repo.get_job(created.id)
    assert job == created
    assert job.kind is JobKind.TRAIN
    assert job.status is JobStatus.QUEUED
    assert job.config == {"model": "qwen", "lr": 1e-6}
    assert (job.step, job.total_steps, job.current_version, job.attempts) == (0, 10, None, 0)
    assert not job.cancel_requested
    assert job.created_at.tzinfo is not None
    assert job.started_at is None and job.finished_at is None
    with pytest.raises(FrozenInstanceError):
        job.status = JobStatus.RUNNING  # type: ignore[misc]


def test_list_jobs_newest_first_with_filters(repo: Repository) -> None:
    train = repo.create_job("train", {})
    evaluate = repo.create_job(JobKind.EVALUATE, {})
    compare = repo.create_job("compare", {})
    repo.mark_running(evaluate.id)
    assert [job.id for job in repo.list_jobs()] == [compare.id, evaluate.id, train.id]
    assert [job.id for job in repo.list_jobs(limit=2)] == [compare.id, evaluate.id]
    assert [job.id for job in repo.list_jobs(status="running")] == [evaluate.id]
    assert [job.id for job in repo.list_jobs(kind="compare")] == [compare.id]


def test_count_jobs_by_status_and_kind(repo: Repository) -> None:
    assert repo.count_jobs() == 0
    jobs = [repo.create_job(kind, {}) for kind in ("train", "train", "evaluate", "compare")]
    repo.mark_running(jobs[0].id)
    repo.mark_running(jobs[2].id)
    repo.request_cancel(jobs[3].id)
    assert repo.count_jobs() == 4
    assert repo.count_jobs(status="running") == 2
    assert repo.count_jobs(status=JobStatus.QUEUED) == 1
    assert repo.count_jobs(kind="train") == 2
    assert repo.count_jobs(status="running", kind=JobKind.TRAIN) == 1
    assert repo.count_jobs(status="cancelled", kind="train") == 0


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda repo: repo.create_job("finetune", {}), "kind: 'finetune' is not one of"),
        (lambda repo: repo.count_jobs(status="paused"), "status: 'paused'"),
        (lambda repo: repo.count_jobs(kind="finetune"), "kind: 'finetune'"),
        (lambda repo: repo.create_job("train", ["not", "a", "dict"]), "JSON object"),
        (lambda repo: repo.create_job("train", {"x": float("nan")}), "not storable as JSON"),
        (lambda repo: repo.create_job("train", {"x": object()}), "not storable as JSON"),
        (lambda repo: repo.create_job("train", {}, total_steps=-1), "negative"),
        (lambda repo: repo.list_jobs(status="paused"), "status: 'paused'"),
        (lambda repo: repo.list_jobs(limit=-1), "limit: -1 is outside"),
    ],
)
def test_invalid_job_input_is_refused(repo: Repository, call, match: str) -> None:
    with pytest.raises(InvalidValue, match=match):
        call(repo)
    assert repo.list_jobs() == []


@pytest.mark.parametrize(
    "call",
    [
        lambda repo: repo.get_job(999),
        lambda repo: repo.mark_running(999),
        lambda repo: repo.update_progress(999, 1),
        lambda repo: repo.request_cancel(999),
        lambda repo: repo.start_attempt(999),
        lambda repo: repo.mark_failed(999, "boom"),
        lambda repo: repo.set_celery_task_id(999, "t"),
        lambda repo: repo.delete_job(999),
    ],
)
def test_unknown_job_ids_raise_job_not_found(repo: Repository, call) -> None:
    with pytest.raises(JobNotFound, match="job 999 does not exist") as raised:
        call(repo)
    assert raised.value.job_id == 999


def test_lifecycle_to_success(repo: Repository) -> None:
    job = repo.create_job("train", {}, total_steps=3)
    repo.set_celery_task_id(job.id, "task-1")
    running = repo.mark_running(job.id)
    assert running.status is JobStatus.RUNNING
    assert running.started_at is not None
    assert running.celery_task_id == "task-1"
    progressed = repo.update_progress(job.id, 2)
    assert (progressed.step, progressed.total_steps) == (2, 3)
    assert progressed.updated_at >= running.updated_at
    done = repo.mark_succeeded(job.id)
    assert done.status is JobStatus.SUCCEEDED
    assert done.finished_at is not None and done.finished_at >= done.started_at
    assert done.error is None


def test_failure_keeps_the_error(repo: Repository) -> None:
    job = repo.create_job("evaluate", {})
    repo.mark_running(job.id, celery_task_id="task-9")
    failed = repo.mark_failed(job.id, "kv_exhausted: 3 rejected batches in a row")
    assert failed.status is JobStatus.FAILED
    assert failed.error == "kv_exhausted: 3 rejected batches in a row"
    assert failed.celery_task_id == "task-9"
    assert repo.get_job(job.id) == failed


def test_a_stalled_train_job_keeps_its_reason_and_can_be_reopened(repo: Repository) -> None:
    queued = repo.create_job("train", {})
    with pytest.raises(InvalidTransition, match="'queued': cannot become 'stalled'"):
        repo.mark_stalled(queued.id, "never ran")
    repo.mark_running(queued.id)
    stalled = repo.mark_stalled(queued.id, "every sample scored 0.0 in 6 batches")
    assert stalled.status is JobStatus.STALLED and stalled.status.is_terminal
    assert stalled.error == "every sample scored 0.0 in 6 batches"
    assert stalled.finished_at is not None
    reopened = repo.reopen(queued.id)
    assert reopened.status is JobStatus.QUEUED and reopened.error is None


def test_redelivered_task_runs_again_and_counts_attempts(repo: Repository) -> None:
    job = repo.create_job("train", {})
    assert repo.start_attempt(job.id).attempts == 1
    first = repo.mark_running(job.id)
    assert repo.start_attempt(job.id).attempts == 2
    again = repo.mark_running(job.id)  # the worker died; Celery delivered the task again
    assert again.status is JobStatus.RUNNING
    assert again.started_at == first.started_at
    assert again.attempts == 2


FINISHERS = {
    "succeeded": lambda repo, job_id: repo.mark_succeeded(job_id),
    "failed": lambda repo, job_id: repo.mark_failed(job_id, "boom"),
    "stalled": lambda repo, job_id: repo.mark_stalled(job_id, "no reward variance"),
    "cancelled": lambda repo, job_id: repo.mark_cancelled(job_id),
}


@pytest.mark.parametrize("final", FINISHERS)
def test_finished_jobs_cannot_change(repo: Repository, final: str) -> None:
    job = repo.create_job("train", {})
    repo.mark_running(job.id)
    FINISHERS[final](repo, job.id)
    with pytest.raises(InvalidTransition, match=f"is '{final}': cannot become 'running'"):
        repo.mark_running(job.id)
    with pytest.raises(InvalidTransition):
        repo.mark_succeeded(job.id)
    with pytest.raises(InvalidTransition, match="cannot update progress"):
        repo.update_progress(job.id, 1)
    assert repo.get_job(job.id).status == final


def test_queued_job_cannot_succeed_or_report_progress(repo: Repository) -> None:
    job = repo.create_job("train", {})
    with pytest.raises(InvalidTransition, match="'queued': cannot become 'succeeded'"):
        repo.mark_succeeded(job.id)
    with pytest.raises(InvalidTransition, match="'queued': cannot update progress"):
        repo.update_progress(job.id, 1)


def test_progress_must_stay_within_total(repo: Repository) -> None:
    job = repo.create_job("train", {}, total_steps=5)
    repo.mark_running(job.id)
    with pytest.raises(InvalidValue, match=r"outside 0\.\.5"):
        repo.update_progress(job.id, 6)
    with pytest.raises(InvalidValue):
        repo.update_progress(job.id, -1)
    assert repo.update_progress(job.id, 7, total_steps=8).total_steps == 8


def test_cancel_a_queued_job_cancels_it_at_once(repo: Repository) -> None:
    job = repo.create_job("train", {})
    cancelled = repo.request_cancel(job.id)
    assert cancelled.status is JobStatus.CANCELLED
    assert cancelled.cancel_requested and cancelled.finished_at is not None
    with pytest.raises(InvalidTransition):
        repo.mark_running(job.id)  # a worker picking the task up late must not run it


def test_cancel_a_running_job_is_cooperative(repo: Repository) -> None:
    job = repo.create_job("train", {}, total_steps=10)
    repo.mark_running(job.id)
    assert not repo.get_job(job.id).cancel_requested
    assert repo.request_cancel(job.id).status is JobStatus.CANCELLING
    assert repo.request_cancel(job.id).status is JobStatus.CANCELLING  # idempotent
    assert repo.get_job(job.id).cancel_requested
    assert repo.update_progress(job.id, 4).cancel_requested  # the worker's per-step check
    stopped = repo.mark_cancelled(job.id, "cancelled by user at step 4")
    assert stopped.status is JobStatus.CANCELLED
    assert stopped.error == "cancelled by user at step 4"
    assert repo.request_cancel(job.id) == stopped  # finished jobs are left alone


def test_delete_job_removes_everything_under_it(repo: Repository) -> None:
    job = running_job(repo, versions=2)
    other = running_job(repo, versions=1)
    repo.record_batch(make_batch(job.id, [make_sample(0, g) for g in range(3)]))
    rejected = make_batch(
        job.id, [make_sample(1, 0, version=1)], version=1, status="rejected", reasons=("x",)
    )
    repo.record_batch(rejected)
    kept = repo.record_batch(make_batch(other.id, [make_sample()]))
    repo.mark_succeeded(job.id)

    repo.delete_job(job.id)

    with pytest.raises(JobNotFound):
        repo.get_job(job.id)
    with repo.engine.connect() as connection:
        for model in (PolicyVersion, RolloutBatch, Sample, VersionSampleStats):
            job_ids = connection.scalars(sa.select(model.job_id).distinct()).all()
            assert job_ids == [other.id], model.__tablename__
    assert repo.list_batches(other.id) == [kept]


def test_running_job_cannot_be_deleted(repo: Repository) -> None:
    job = running_job(repo)
    with pytest.raises(InvalidTransition, match="cannot be deleted"):
        repo.delete_job(job.id)
    repo.request_cancel(job.id)
    with pytest.raises(InvalidTransition):
        repo.delete_job(job.id)
    repo.mark_cancelled(job.id)
    repo.delete_job(job.id)
    assert repo.list_jobs() == []


def test_job_ids_are_never_reused(repo: Repository) -> None:
    """A stale task for a deleted job must not find a new job under the same id."""
    first = repo.create_job("train", {})
    repo.delete_job(first.id)
    assert repo.create_job("train", {}).id > first.id


def test_record_version_updates_the_current_version(repo: Repository) -> None:
    job = running_job(repo, versions=1)
    assert job.current_version == 0
    repo.record_policy_version(PolicyVersionRecord(job.id, 1, parent_version=0))
    assert repo.get_job(job.id).current_version == 1


def test_a_base_checksum_is_recorded_once_per_job(repo: Repository) -> None:
    job = running_job(repo)
    assert job.base_checksum is None
    assert repo.record_base_checksum(job.id, "ab" * 32).base_checksum == "ab" * 32
    assert repo.record_base_checksum(job.id, "ab" * 32).base_checksum == "ab" * 32  # resumed
    with pytest.raises(InvalidValue, match=f"trained on a base with checksum {'ab' * 6}"):
        repo.record_base_checksum(job.id, "cd" * 32)
    assert repo.get_job(job.id).base_checksum == "ab" * 32
    with pytest.raises(StaleOwner):
        repo.record_base_checksum(job.id, "ab" * 32, fence=job.fence + 1)
    repo.mark_succeeded(job.id)
    with pytest.raises(InvalidTransition):
        repo.record_base_checksum(job.id, "ab" * 32)
