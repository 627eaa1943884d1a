"""Re-queue jobs whose owner stopped beating: every worker checks, every few seconds, for
running (or cancelling) jobs whose heartbeat is older than ``RLWB_HEARTBEAT_TIMEOUT`` (or
that a warm shutdown released) and takes them from their owner (a new fencing token: the old
owner can store nothing more) to queue them again under a new task id.

The embedded broker loses a message its worker had taken; Redis keeps it unacknowledged until
the visibility timeout (a day). Either way the job resumes from its last saved version (and,
when the old message finally comes back, it finds the job owned by the new task and is dropped).
"""

import logging
import threading
import uuid
from datetime import timedelta

from celery import Celery

from db import JobStatus, Repository
from db.timestamps import utcnow
from workers.dispatch import send
from workers.resend import resend_lost
from workers.settings import Settings

log = logging.getLogger(__name__)

ACTIVE = (JobStatus.RUNNING, JobStatus.CANCELLING)


def recover_stale(app: Celery, repo: Repository, timeout_s: float) -> list[int]:
    """One pass: re-queue the jobs without a recent heartbeat; returns their ids."""
    older_than = utcnow() - timedelta(seconds=timeout_s)
    recovered = []
    for status in ACTIVE:
        for job in repo.list_jobs(limit=1000, status=status):
            task_id = str(uuid.uuid4())
            taken = repo.requeue_stale(job.id, older_than, task_id)
            if taken is None:
                continue
            recovered.append(job.id)
            if taken.status is JobStatus.CANCELLED:
                log.warning("job %s had no live worker: cancelled as requested", job.id)
                continue
            send(app, taken, task_id)
            log.warning("job %s had no live worker: re-queued as task %s", job.id, task_id)
    return recovered


def watch(app: Celery, repo: Repository, settings: Settings, stop: threading.Event) -> None:
    """Every ``heartbeat_timeout_s / 5`` seconds until ``stop`` is set: `recover_stale`, and
    `resend_lost` for queued jobs that have no message any more."""
    timeout_s = settings.heartbeat_timeout_s
    while True:
        try:
            recover_stale(app, repo, timeout_s)
            resend_lost(app, repo, settings, grace_s=timeout_s)
        except Exception:  # the database or the broker is briefly away: try again
            log.exception("recovery pass failed")
        if stop.wait(timeout_s / 5):
            return
