"""Heartbeats are judged by the database server's clock (issue 24, item 5): a worker whose
clock runs 61 s ahead used to take healthy jobs (the timeout is 60 s) until they failed after
three attempts; one whose clock ran 61 s behind lost its own. On SQLite and PostgreSQL."""

import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import URL

import db.timestamps
from db import JobStatus, Repository, upgrade
from tests.db.conftest import BACKENDS
from workers.app import app, recover_stale
from workers.jobs import heartbeat

TIMEOUT_S = 60.0
SKEW_S = 61.0


@pytest.fixture(params=BACKENDS)
def any_repo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Repository]:
    if request.param == "sqlite":
        url = URL.create("sqlite+pysqlite", database=str(tmp_path / "rlwb.db"))
    else:
        url = request.getfixturevalue("postgres_schemas").create()
    upgrade(url)
    repo = Repository.from_url(url)
    yield repo
    repo.close()


def set_worker_clock(monkeypatch: pytest.MonkeyPatch, skew_s: float) -> None:
    """This process's clock, as `db` and `workers` read it, runs ``skew_s`` seconds off."""
    real = db.timestamps.utcnow

    def skewed():
        return real() + timedelta(seconds=skew_s)

    for name, module in list(sys.modules.items()):
        if name.partition(".")[0] in ("db", "workers") and getattr(module, "utcnow", 0) is real:
            monkeypatch.setattr(module, "utcnow", skewed)


def test_a_worker_clock_off_by_61_s_cannot_take_a_healthy_job(any_repo, monkeypatch):
    repo = any_repo
    with monkeypatch.context() as behind:  # the owner's clock runs 61 s behind
        set_worker_clock(behind, -SKEW_S)
        job = repo.create_job("train", {"model": "toy"})
        repo.set_celery_task_id(job.id, "task-1")
        attempt = repo.start_attempt(job.id, "task-1")
        repo.mark_running(job.id, fence=attempt.fence)
        with heartbeat(repo, job.id, attempt.fence, interval=0.05):
            time.sleep(0.3)

    with monkeypatch.context() as ahead:  # another worker's clock runs 61 s ahead
        set_worker_clock(ahead, SKEW_S)
        assert recover_stale(app, repo, TIMEOUT_S) == []

    info = repo.get_job(job.id)
    assert info.status is JobStatus.RUNNING and info.fence == attempt.fence
    assert info.celery_task_id == "task-1" and info.attempts == 1
    # the same check takes a job whose heartbeat is older than the timeout
    assert repo.requeue_stale(job.id, 0, "task-2").status is JobStatus.QUEUED
