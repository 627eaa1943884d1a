"""The Celery app and its plumbing: configuration from the environment (`workers.settings`),
the repository of this process, sending a job's task, the revoke hook, and recovery of jobs
whose worker died or whose message was lost.

``celery -A workers.app worker --pool threads -c 1 -Q gpu`` runs a GPU worker (``rlwb worker``
does the same). This module imports no torch: tasks load the engine lazily, in the worker.
Recovery: every worker checks, every few seconds, for running (or cancelling) jobs whose
heartbeat is older than ``RLWB_HEARTBEAT_TIMEOUT`` (or that a warm shutdown released) and takes
them from their owner (a new fencing token: the old owner can store nothing more) to queue them
again under a new task id; and for queued jobs whose message the broker no longer holds
(``celery purge``, a lost message), which are sent again: the database, not the broker, says
what is queued. The embedded broker loses a message its worker had taken; Redis keeps it
unacknowledged until the visibility timeout (a day). Either way the job resumes from its last
saved version (and, when the old message finally comes back, or two workers sent the same job
again, the extra message finds the job owned by another task and is dropped).
"""

import functools
import json
import logging
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from celery.signals import worker_ready, worker_shutting_down
from celery.utils.functional import maybe_list
from celery.worker.control import Panel, inspect_command

from db import JobInfo, JobStatus, Repository, resolve_url
from db.session import private_dir, private_file
from db.timestamps import utcnow
from workers.control import SHUTTING_DOWN
from workers.settings import (
    DAY_S,
    EMBEDDED_POLL_S,
    GPU_QUEUE,
    INTERACTIVE_QUEUE,
    INTERACTIVE_TASKS,
    REDIS_POLL_S,
    TASK_FOR_KIND,
    Settings,
)

log = logging.getLogger(__name__)

ACTIVE = (JobStatus.RUNNING, JobStatus.CANCELLING)
UNACKED = "unacked"  # kombu's Redis transport: messages delivered and not yet acknowledged


# --- configuration ----------------------------------------------------------------------


def broker_settings(settings: Settings) -> dict[str, Any]:
    """Broker and result backend: Redis, or the embedded filesystem broker + SQLite results
    (their folders and the results database for this user alone: `db.session.private_dir`)."""
    if not settings.embedded:
        return {
            "broker_url": settings.redis_url,
            "result_backend": settings.redis_url,
            "broker_transport_options": {
                "visibility_timeout": settings.visibility_timeout_s,
                # kombu's Redis BRPOP waits 1 s by default, so every broadcast (the Queue
                # view's) took at least that long, whatever its timeout
                "polling_interval": REDIS_POLL_S,
            },
        }
    messages = settings.broker_queue_dir
    control_dir = settings.broker_dir / "control"
    for folder in (messages, control_dir):
        private_dir(folder)
    results = private_file(settings.data_dir / "celery-results.db")
    return {
        "broker_url": "filesystem://localhost/",
        "broker_transport": "workers.embedded_broker:Transport",
        "broker_transport_options": {
            "data_folder_in": str(messages),
            "data_folder_out": str(messages),
            "control_folder": str(control_dir),
            # kombu's default (1 s) delays every broadcast reply, e.g. the Queue tab's
            "polling_interval": EMBEDDED_POLL_S,
        },
        "result_backend": f"db+sqlite:///{results}",
    }


def celery_config(settings: Settings) -> dict[str, Any]:
    """The whole Celery configuration (RL notes, section 11)."""
    return {
        **broker_settings(settings),
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_routes": {
            **{name: {"queue": GPU_QUEUE} for name in TASK_FOR_KIND.values()},
            **{name: {"queue": INTERACTIVE_QUEUE} for name in INTERACTIVE_TASKS},
        },
        "task_default_queue": GPU_QUEUE,
        "worker_concurrency": 1,
        "worker_prefetch_multiplier": 1,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_track_started": True,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_soft_shutdown_timeout": 60.0,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "result_expires": DAY_S,
        "timezone": "UTC",
    }


app = Celery("rlwb", include=["workers.tasks"])
app.conf.update(celery_config(Settings.from_env()))
RECOVERY_STOP = threading.Event()


# --- storage and dispatch -----------------------------------------------------------------


@functools.cache
def _repository(url: str) -> Repository:
    return Repository.from_url(url)


def repository() -> Repository:
    """One `Repository` per process and database URL: the one the environment names now
    (``DATABASE_URL``, else the SQLite file)."""
    return _repository(resolve_url().render_as_string(hide_password=False))


def send(app: Celery, job: JobInfo, task_id: str) -> None:
    """Send the message that runs ``job`` under ``task_id`` (already recorded on its row)."""
    app.tasks[TASK_FOR_KIND[job.kind]].apply_async(args=[job.id], task_id=task_id)


def enqueue(app: Celery, repo: Repository, job: JobInfo) -> str:
    """Send the task that runs ``job`` and return its id (now the job's owner token): the job
    row learns the task id before the message exists."""
    task_id = str(uuid.uuid4())
    repo.set_celery_task_id(job.id, task_id)
    send(app, job, task_id)
    return task_id


# --- revoke ---------------------------------------------------------------------------------
# ``celery control revoke TASK_ID`` also cancels the job in the database, so a revoked job
# stays revoked when the worker restarts (Celery keeps revoked ids in worker memory only):
# the worker's ``revoke`` control command is wrapped once, here; Celery's own handling runs
# first, then the job row is cancelled.
_celery_revoke = Panel.data["revoke"]


def revoke(state: Any, task_id: Any, terminate: bool = False, signal: Any = None, **kw: Any):
    reply = _celery_revoke(state, task_id, terminate, signal, **kw)
    task_ids = {str(t) for t in maybe_list(task_id) or []}
    for job in repository().cancel_tasks(task_ids):
        log.warning("task revoked: job %s is %s", job.id, job.status.value)
    return reply


revoke.__doc__ = _celery_revoke.__doc__
Panel.data["revoke"] = revoke


@inspect_command()
def queue_state(state: Any, **_: Any) -> dict[str, list[dict[str, Any]]]:
    """The tasks this worker runs (``active``) and holds (``reserved``), in one reply: the
    Queue view's single broadcast (two would take two timeouts)."""
    return {"active": Panel.data["active"](state), "reserved": Panel.data["reserved"](state)}


# --- recovery -------------------------------------------------------------------------------


def recover_stale(app: Celery, repo: Repository, timeout_s: float) -> list[int]:
    """One pass: re-queue the jobs without a heartbeat in the last ``timeout_s`` seconds
    (by the database server's clock, not this worker's); returns their ids."""
    recovered = []
    for status in ACTIVE:
        for job in repo.list_jobs(limit=1000, status=status):
            task_id = str(uuid.uuid4())
            taken = repo.requeue_stale(job.id, timeout_s, task_id)
            if taken is None:
                continue
            recovered.append(job.id)
            if taken.status is JobStatus.CANCELLED:
                log.warning("job %s had no live worker: cancelled as requested", job.id)
                continue
            send(app, taken, task_id)
            log.warning("job %s had no live worker: re-queued as task %s", job.id, task_id)
    return recovered


def _task_id(payload: bytes | str) -> str | None:
    try:
        message = json.loads(payload)
    except ValueError:  # not a message (the embedded broker renames whole files into place)
        return None
    if isinstance(message, list):  # an unacked entry: [message, exchange, routing_key]
        message = message[0]
    return message.get("headers", {}).get("id")


def _redis_payloads(redis_url: str) -> list[bytes]:
    """Every message the Redis broker holds for the queue: waiting, and delivered but not
    yet acknowledged."""
    client = redis.Redis.from_url(redis_url)
    try:
        queued = [
            payload
            for key in client.scan_iter(match=f"{GPU_QUEUE}*", _type="list")
            for payload in client.lrange(key, 0, -1)
        ]
        return [*queued, *client.hvals(UNACKED)]
    finally:
        client.close()


def _embedded_payloads(queue_dir: Path) -> list[bytes]:
    """Every message file the embedded broker holds for the queue (kombu's filesystem
    transport names them ``<ms>_<uuid>.<queue>.msg`` and deletes one when a worker takes it)."""
    payloads = []
    for path in queue_dir.iterdir():
        if path.name.partition(".")[2] != f"{GPU_QUEUE}.msg":
            continue
        try:
            payloads.append(path.read_bytes())
        except FileNotFoundError:  # taken by a worker meanwhile
            continue
    return payloads


def broker_task_ids(settings: Settings) -> set[str]:
    """The task ids of every message the broker (Redis or embedded) holds for the queue."""
    if settings.embedded:
        payloads = _embedded_payloads(settings.broker_queue_dir)
    else:
        payloads = _redis_payloads(settings.redis_url)
    return {task_id for task_id in map(_task_id, payloads) if task_id}


def resend_lost(app: Celery, repo: Repository, settings: Settings, grace_s: float) -> list[int]:
    """Send again the jobs queued for over ``grace_s`` seconds without a message in the
    broker. Cancel a job to drop it."""
    older = utcnow() - timedelta(seconds=grace_s)
    waiting = [
        j for j in repo.list_jobs(limit=1000, status=JobStatus.QUEUED) if j.updated_at < older
    ]
    if not waiting:
        return []
    present = broker_task_ids(settings)
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


@worker_ready.connect
def _recover_orphans(sender: Any = None, **_: Any) -> None:
    """Watch for jobs whose worker died (their heartbeat stopped) and re-queue them, and for
    queued jobs whose message is gone (purged) and send them again."""
    threading.Thread(
        target=watch,
        args=(sender.app, repository(), Settings.from_env(), RECOVERY_STOP),
        name="recover",
        daemon=True,
    ).start()


@worker_shutting_down.connect
def _stop_jobs(**_: Any) -> None:
    """Warm shutdown: the running job stops at its next step, is released (the attempt does
    not count) and goes back to the queue."""
    SHUTTING_DOWN.set()
    RECOVERY_STOP.set()
