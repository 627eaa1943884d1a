"""Sending a job's task: the job row learns the task id before the message exists."""

import uuid

from celery import Celery

from db import JobInfo, Repository
from workers.settings import TASK_FOR_KIND


def send(app: Celery, job: JobInfo, task_id: str) -> None:
    """Send the message that runs ``job`` under ``task_id`` (already recorded on its row)."""
    app.tasks[TASK_FOR_KIND[job.kind]].apply_async(args=[job.id], task_id=task_id)


def enqueue(app: Celery, repo: Repository, job: JobInfo) -> str:
    """Send the task that runs ``job`` and return its id (now the job's owner token)."""
    task_id = str(uuid.uuid4())
    repo.set_celery_task_id(job.id, task_id)
    send(app, job, task_id)
    return task_id
