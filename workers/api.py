"""What the UI and the CLI call: the job vocabulary and validation (`workers.vocabulary`),
submitting, cancelling and resuming jobs, and the queue. Imports no torch and no user code;
Celery is configured on first use, not at import.

from workers.api import submit_job, cancel_job, queue_overview
job = submit_job("train", {"model": DEMO_MODEL, "task": "addition", "steps": 200})
"""

from typing import Any

from celery import Celery

from db import JobInfo, JobKind, JobStatus
from workers.exposure import exposure_problem
from workers.heldout import METRIC as HELDOUT_METRIC
from workers.limits import check_paths, is_under
from workers.settings import GPU_QUEUE, Settings
from workers.specs import SpecError
from workers.storage import repository
from workers.vocabulary import (
    CHAT_MAX_TEMPERATURE,
    CHAT_MAX_TOKENS,
    DEMO_MODEL,
    LAUNCH_DEFAULTS,
    REWARDS,
    TASKS,
    TRAINER_DEFAULTS,
    check_reward,
    count_records,
    validate_job,
)

__all__ = [
    "CHAT_MAX_TEMPERATURE",
    "CHAT_MAX_TOKENS",
    "COMMANDS",
    "DEMO_MODEL",
    "HELDOUT_METRIC",
    "LAUNCH_DEFAULTS",
    "REWARDS",
    "TASKS",
    "TRAINER_DEFAULTS",
    "SpecError",
    "audit",
    "cancel_job",
    "chat",
    "check_reward",
    "count_records",
    "exposure_problem",
    "is_under",
    "queue_counts",
    "queue_overview",
    "resume_job",
    "submit_job",
    "token_diff",
    "validate_job",
]

CHAT_TIMEOUT_S = 120.0
AUDIT_TIMEOUT_S = 600.0
CELERY = "celery -A workers.app"
COMMANDS = {
    "workers online": f"{CELERY} inspect ping",
    "active": f"{CELERY} inspect active",
    "reserved": f"{CELERY} inspect reserved",
    "status": f"{CELERY} status",
    "purge queued messages": f"{CELERY} purge -Q {GPU_QUEUE}",
    "revoke a queued task": f"{CELERY} control revoke TASK_ID",
}


def celery_app() -> Celery:
    """The Celery app with the tasks registered."""
    from workers import tasks

    return tasks.app


def submit_job(kind: JobKind | str, config: dict[str, Any]) -> JobInfo:
    """Validate ``config`` (see `workers.specs`; raises `SpecError`), store a queued job and
    send its task to the ``gpu`` queue."""
    from workers.dispatch import enqueue

    total_steps = validate_job(kind, config)
    check_paths(config, Settings.from_env())
    repo = repository()
    job = repo.create_job(kind, config, total_steps=total_steps)
    enqueue(celery_app(), repo, job)
    return repo.get_job(job.id)


def cancel_job(job_id: int) -> JobInfo:
    """Cancel a job: a queued one at once (and its task is revoked), a running one at its
    next step (it ends ``cancelled`` with everything so far kept)."""
    job = repository().request_cancel(job_id)
    if job.status is JobStatus.CANCELLED and job.celery_task_id:
        celery_app().control.revoke(job.celery_task_id)
    return job


def resume_job(job_id: int) -> JobInfo:
    """Queue a failed or cancelled train job again: it continues from its newest checkpoint
    at that version (`db.InvalidTransition` for any other job)."""
    from workers.dispatch import enqueue

    repo = repository()
    job = repo.reopen(job_id)
    enqueue(celery_app(), repo, job)
    return repo.get_job(job_id)


def chat(
    job_id: int,
    version: int,
    messages: list[dict[str, str]],
    temperature: float,
    max_tokens: int,
    seed: int | None = None,
    timeout: float = CHAT_TIMEOUT_S,
) -> dict[str, Any]:
    """One Playground turn, answered by a worker of the ``interactive`` queue (see
    `workers.chat`); ``{"problem": ...}`` when none answers within ``timeout`` seconds."""
    args = [job_id, version, messages, temperature, max_tokens, seed]
    return _interactive("workers.chat", args, timeout)


def audit(sample_ids: list[int], timeout: float = AUDIT_TIMEOUT_S) -> dict[str, Any]:
    """Re-score stored samples under their stamped versions' kept weights on an
    ``interactive`` worker (see `workers.scoring.audit_samples`)."""
    return _interactive("workers.audit", [list(sample_ids)], timeout)


def token_diff(
    sample_id: int, version_a: int, version_b: int, timeout: float = CHAT_TIMEOUT_S
) -> dict[str, Any]:
    """One stored response scored under two versions on an ``interactive`` worker (see
    `workers.scoring.token_diff`)."""
    return _interactive("workers.token_diff", [sample_id, version_a, version_b], timeout)


def _interactive(name: str, args: list[Any], timeout: float) -> dict[str, Any]:
    """Run task ``name`` on the ``interactive`` queue and wait for its JSON answer;
    ``{"problem": ...}`` when no worker answers within ``timeout`` seconds."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    result = celery_app().tasks[name].apply_async(args=args, expires=timeout)
    try:
        return result.get(timeout=timeout)
    except CeleryTimeout:
        result.revoke()
        return {
            "problem": f"no interactive worker answered within {timeout:g} s: start one "
            "(`rlwb worker --interactive`)"
        }


def _tasks(reply: dict[str, list[dict[str, Any]]] | None) -> list[dict[str, Any]]:
    return [
        {"worker": worker, "task_id": task["id"], "name": task["name"], "args": task["args"]}
        for worker, tasks_ in (reply or {}).items()
        for task in tasks_
    ]


def queue_overview(timeout: float = 1.0) -> dict[str, Any]:
    """Workers online, the tasks they run (``active``) and hold (``reserved``), the job
    counts of the database, and the equivalent ``celery`` commands.

    Takes about ``timeout`` seconds: the workers that answer a broadcast for their active
    tasks are the ones online; those are then asked for their reserved tasks, which returns
    as soon as each answered.
    """
    app = celery_app()
    active = app.control.inspect(timeout=timeout).active() or {}
    online = sorted(active)
    reserved = None
    if online:
        inspect = app.control.inspect(timeout=timeout, destination=online, limit=len(online))
        reserved = inspect.reserved()
    return {
        **queue_counts(),
        "workers": online,
        "workers_online": len(online),
        "active": _tasks(active),
        "reserved": _tasks(reserved),
    }


def queue_counts() -> dict[str, Any]:
    """What the queue view knows without asking the workers (milliseconds): the broker,
    the database's queued / running / cancelling job counts and the ``celery`` commands."""
    repo = repository()
    return {
        "broker": "embedded (filesystem)" if Settings.from_env().embedded else "redis",
        "jobs": {
            status.value: repo.count_jobs(status=status)
            for status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING)
        },
        "commands": COMMANDS,
    }
