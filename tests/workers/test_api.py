"""`workers.api` with eager tasks (Celery glue only: no broker, no serialisation)."""

import pytest
from sqlalchemy import insert

from db import JobStatus
from db.models import Job
from tests.workers.helpers import train_config
from workers import api, tasks


def test_submit_runs_the_job_through_its_task(eager, repo, tiny_model):
    job = api.submit_job("train", train_config(tiny_model))
    info = repo.get_job(job.id)
    assert info.status is JobStatus.SUCCEEDED and info.total_steps == 3
    assert info.celery_task_id and info.attempts == 1
    assert [v.version for v in repo.list_versions(job.id)] == [0, 1, 2, 3]


def test_submit_and_resume_report_the_job_they_queued_even_when_a_worker_takes_it_at_once(
    eager, repo, tiny_model
):
    """Eager tasks run the job inside the send: the job a worker takes at once. The answer is
    what the call did (queued, with its task), not the state the job reached meanwhile."""
    job = api.submit_job("train", train_config(tiny_model))
    assert job.status is JobStatus.QUEUED and job.celery_task_id
    assert repo.get_job(job.id).status is JobStatus.SUCCEEDED
    cancelled = repo.create_job("train", train_config(tiny_model))
    assert api.cancel_job(cancelled.id).status is JobStatus.CANCELLED
    resumed = api.resume_job(cancelled.id)
    assert resumed.status is JobStatus.QUEUED
    assert resumed.celery_task_id == repo.get_job(cancelled.id).celery_task_id
    assert repo.get_job(cancelled.id).status is JobStatus.SUCCEEDED


def test_invalid_configs_are_refused_before_anything_is_stored(eager, repo):
    with pytest.raises(ValueError, match="exactly one of 'task' or 'data'"):
        api.submit_job("train", {"model": "m"})
    assert repo.list_jobs() == []


def test_cancelling_a_queued_job_revokes_its_task_and_the_task_then_does_nothing(
    eager, repo, tiny_model
):
    job = repo.create_job("train", train_config(tiny_model))
    repo.set_celery_task_id(job.id, "task-1")

    cancelled = api.cancel_job(job.id)

    assert cancelled.status is JobStatus.CANCELLED and eager == ["task-1"]
    result = tasks.train.apply(args=[job.id], task_id="task-1").get()
    assert result == {"job_id": job.id, "status": "cancelled", "error": None}
    assert repo.get_job(job.id).attempts == 0


def test_cancelling_a_running_job_asks_its_worker(eager, repo, tiny_model):
    job = repo.create_job("train", train_config(tiny_model))
    repo.mark_running(job.id, celery_task_id="task-2")
    assert api.cancel_job(job.id).status is JobStatus.CANCELLING
    assert eager == []


def test_queue_overview_without_workers(eager, repo, tiny_model):
    repo.create_job("train", train_config(tiny_model))
    overview = api.queue_overview(timeout=0.2)
    assert overview["workers_online"] == 0 and overview["active"] == []
    assert overview["jobs"]["queued"] == 1
    assert overview["commands"]["active"] == "celery -A workers.app inspect active"


def test_a_warm_shutdown_hands_the_job_back_to_the_queue(eager, repo, tiny_model, monkeypatch):
    from workers.control import SHUTTING_DOWN

    job = repo.create_job("train", train_config(tiny_model, steps=50), total_steps=50)
    shutting_down = [True]
    monkeypatch.setattr(
        SHUTTING_DOWN, "is_set", lambda: shutting_down[0] and repo.get_job(job.id).step >= 2
    )

    result = tasks.train.apply(args=[job.id], task_id="task-3")

    assert result.state == "REJECTED"  # Reject(requeue=True): the broker delivers it again
    info = repo.get_job(job.id)
    assert info.status is JobStatus.RUNNING and info.current_version == 2
    assert info.attempts == 0 and info.heartbeat_at is None  # released: no attempt used
    shutting_down[0] = False
    assert tasks.train.apply(args=[job.id], task_id="task-3").get()["status"] == "succeeded"
    assert repo.get_job(job.id).attempts == 1


def test_queue_overview_counts_every_job(eager, repo):
    """More jobs than any list page holds are still counted."""
    queued = [{"kind": "train", "status": "queued", "config": {}} for _ in range(1002)]
    with repo.engine.begin() as connection:
        connection.execute(insert(Job), queued)
    repo.mark_running(repo.list_jobs(limit=1)[0].id)
    overview = api.queue_overview(timeout=0.2)
    assert overview["jobs"] == {"queued": 1001, "running": 1, "cancelling": 0}
