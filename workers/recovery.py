"""Re-queue jobs whose worker died: at worker start-up, a job the database says is running
(or cancelling) whose Celery task no live worker holds is sent again under a new task id.

The embedded broker loses a message its worker had taken; Redis keeps it unacknowledged until
the visibility timeout (a day). Either way the job resumes from its last saved version (and,
when it finally comes back, the old message finds the job owned by the new task and is dropped).
"""

import logging

from celery import Celery

from db import JobInfo, JobStatus, Repository
from workers.dispatch import enqueue

log = logging.getLogger(__name__)

ACTIVE = (JobStatus.RUNNING, JobStatus.CANCELLING)


def live_task_ids(app: Celery, timeout: float) -> set[str]:
    """Ids of the tasks every answering worker is running or has reserved."""
    online = list(app.control.inspect(timeout=timeout).ping() or {})
    if not online:
        return set()
    inspect = app.control.inspect(timeout=timeout, destination=online, limit=len(online))
    ids = set()
    for reply in (inspect.active(), inspect.reserved()):
        for tasks in (reply or {}).values():
            ids.update(task["id"] for task in tasks)
    return ids


def active_jobs(repo: Repository) -> list[JobInfo]:
    return [job for status in ACTIVE for job in repo.list_jobs(limit=1000, status=status)]


def recover_orphans(app: Celery, repo: Repository, timeout: float = 2.0) -> list[int]:
    """Re-queue the orphaned jobs; returns their ids."""
    candidates = active_jobs(repo)
    if not candidates:
        return []
    live = live_task_ids(app, timeout)
    recovered = []
    for job in candidates:
        if job.celery_task_id in live:
            continue
        current = repo.get_job(job.id)
        if current.status in ACTIVE and current.celery_task_id == job.celery_task_id:
            task_id = enqueue(app, repo, current)
            log.warning("job %s had no live worker: re-queued as task %s", job.id, task_id)
            recovered.append(job.id)
    return recovered
