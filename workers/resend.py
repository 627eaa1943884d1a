"""Queued jobs whose message the broker no longer holds (``celery purge``, a lost message)
are sent again: the database, not the broker, says what is queued. Cancel a job to drop it.

Redis only: the ids are read from the queue's list and from the messages workers hold
unacknowledged. The embedded broker is not checked.
"""

import json
import logging
from datetime import timedelta

import redis
from celery import Celery

from db import JobStatus, Repository
from db.timestamps import utcnow
from workers.dispatch import enqueue
from workers.settings import GPU_QUEUE, Settings

log = logging.getLogger(__name__)
UNACKED = "unacked"  # kombu's Redis transport: messages delivered and not yet acknowledged


def _task_id(payload: bytes | str) -> str | None:
    message = json.loads(payload)
    if isinstance(message, list):  # an unacked entry: [message, exchange, routing_key]
        message = message[0]
    return message.get("headers", {}).get("id")


def broker_task_ids(redis_url: str) -> set[str]:
    """The task ids of every message the Redis broker holds for the queue."""
    client = redis.Redis.from_url(redis_url)
    try:
        queued = [
            payload
            for key in client.scan_iter(match=f"{GPU_QUEUE}*", _type="list")
            for payload in client.lrange(key, 0, -1)
        ]
        held = client.hvals(UNACKED)
    finally:
        client.close()
    return {task_id for task_id in map(_task_id, [*queued, *held]) if task_id}


def resend_lost(app: Celery, repo: Repository, settings: Settings, grace_s: float) -> list[int]:
    """Send again the jobs queued for over ``grace_s`` seconds without a message."""
    if settings.embedded:
        return []
    older = utcnow() - timedelta(seconds=grace_s)
    waiting = [
        j for j in repo.list_jobs(limit=1000, status=JobStatus.QUEUED) if j.updated_at < older
    ]
    if not waiting:
        return []
    present = broker_task_ids(settings.redis_url)
    resent = []
    for job in waiting:
        if job.celery_task_id in present:
            continue
        current = repo.get_job(job.id)
        if current.status is JobStatus.QUEUED and current.celery_task_id == job.celery_task_id:
            task_id = enqueue(app, repo, current)
            log.warning("job %s was queued without a message: sent again as %s", job.id, task_id)
            resent.append(job.id)
    return resent
