"""What the UI and the CLI call: the job vocabulary and checks of user input (no user code is
imported), when the UI may be served, the worker side of ``rlwb`` (`workers.commands`),
submitting, cancelling and resuming jobs, and the queue. Imports no torch; Celery is
configured on first use, not at import.

from workers.api import submit_job, cancel_job, queue_overview
job = submit_job("train", {"model": DEMO_MODEL, "task": "addition", "steps": 200})
"""

from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from celery import Celery

from core_engine.rl.clip import clip_active
from core_engine.rl.config import GRPOConfig
from core_engine.rl.data import DataError, load_jsonl
from core_engine.rl.rewards import BUILTIN_REWARDS, check_reward_spec
from core_engine.rl.tasks import BUILTIN_TASKS
from core_engine.task import KV_STRATEGIES
from db import JobInfo, JobKind, JobStatus
from workers.chat import settings_problems as chat_settings_problems
from workers.commands import COMMANDS as WORKER_COMMANDS
from workers.commands import add_commands as add_worker_commands
from workers.commands import run as run_worker_command
from workers.settings import GPU_QUEUE, Settings
from workers.specs import (
    DEMO_MODEL,
    HELDOUT_EVERY,
    HELDOUT_METRIC,
    HELDOUT_PROMPTS,
    SpecError,
    check_paths,
    check_sizes,
    is_under,
    model_roots,
    validate,
)

__all__ = [
    "COMMANDS",
    "DEMO_MODEL",
    "HELDOUT_METRIC",
    "KV_STRATEGIES",
    "LAUNCH_DEFAULTS",
    "REWARDS",
    "TASKS",
    "TRAINER_DEFAULTS",
    "WORKER_COMMANDS",
    "SpecError",
    "add_worker_commands",
    "audit",
    "cancel_job",
    "chat",
    "chat_settings_problems",
    "check_reward",
    "clip_active",
    "count_records",
    "deployment",
    "exposure_problem",
    "is_under",
    "model_roots",
    "queue_counts",
    "queue_overview",
    "resume_job",
    "run_worker_command",
    "submit_job",
    "token_diff",
    "validate_job",
]

TASKS: dict[str, str] = {name: task.description for name, task in BUILTIN_TASKS.items()}
REWARDS: tuple[str, ...] = tuple(BUILTIN_REWARDS)
TRAINER_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(GRPOConfig) if f.default is not MISSING
}
# What a new job starts from: the demo policy on addition, with held-out accuracy checked.
LAUNCH_DEFAULTS: dict[str, Any] = {
    **TRAINER_DEFAULTS,
    "model": DEMO_MODEL,
    "task": "addition",
    "steps": 600,
    "batch_size": 16,
    "group_size": 8,
    "lr": 3e-4,
    "max_tokens": 6,
    "heldout_every": HELDOUT_EVERY,
    "heldout_prompts": HELDOUT_PROMPTS,
}
LOOPBACK_NAMES = ("localhost", "::1")
CHAT_TIMEOUT_S = 120.0
QUEUE_REPLY_TIMEOUT_S = 0.6  # how long the Queue view waits for the workers' replies
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


def check_reward(spec: str) -> None:
    """The reward spec's syntax (`SpecError`); a registered name is checked on the worker."""
    try:
        check_reward_spec(spec)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def count_records(path: str | Path) -> int:
    """How many prompt records a JSONL file holds (`SpecError` if it is unusable)."""
    try:
        return len(load_jsonl(path))
    except (DataError, OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(exc)) from None


def validate_job(kind: JobKind | str, config: dict[str, Any]) -> int | None:
    """Check a job config and its sizes as the worker will (`SpecError`); returns its
    total steps."""
    total_steps = validate(kind, config)
    check_sizes(kind, config)
    return total_steps


def exposure_problem(
    host: str,
    auth: tuple[str, str] | None,
    share: bool = False,
    allow_unauthenticated: bool = False,
) -> str | None:
    """Why the UI may not be served as asked, or None: a non-loopback address or a public
    share link needs a password, unless the operator says that address is private
    (``allow_unauthenticated``)."""
    loopback = host in LOOPBACK_NAMES or host.startswith("127.")
    if auth is not None or (not share and (loopback or allow_unauthenticated)):
        return None
    if share:
        return "refusing a public share link without a password: pass --auth USER:PASSWORD"
    return (
        f"refusing to serve the UI on {host} without a password: pass --auth USER:PASSWORD "
        "(or set RLWB_AUTH), or --allow-unauthenticated if that address is private"
    )


def celery_app() -> Celery:
    """The Celery app with the tasks registered."""
    from workers import tasks

    return tasks.app


def submit_job(kind: JobKind | str, config: dict[str, Any]) -> JobInfo:
    """Validate ``config`` (see `workers.specs`; raises `SpecError`), store a queued job and
    send its task to the ``gpu`` queue."""
    from workers.app import enqueue, repository

    total_steps = validate_job(kind, config)
    check_paths(config, Settings.from_env())
    repo = repository()
    job = repo.create_job(kind, config, total_steps=total_steps)
    enqueue(celery_app(), repo, job)
    return repo.get_job(job.id)


def cancel_job(job_id: int) -> JobInfo:
    """Cancel a job: a queued one at once (and its task is revoked), a running one at its
    next step (it ends ``cancelled`` with everything so far kept)."""
    from workers.app import repository

    job = repository().request_cancel(job_id)
    if job.status is JobStatus.CANCELLED and job.celery_task_id:
        celery_app().control.revoke(job.celery_task_id)
    return job


def resume_job(job_id: int) -> JobInfo:
    """Queue a failed or cancelled train job again: it continues from its newest checkpoint
    at that version (`db.InvalidTransition` for any other job)."""
    from workers.app import enqueue, repository

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


def _broker(settings: Settings) -> str:
    return "embedded (filesystem)" if settings.embedded else "redis"


def deployment() -> str:
    """Where this deployment keeps its data and which broker it uses (one line)."""
    settings = Settings.from_env()
    return f"data: {settings.data_dir}; broker: {_broker(settings)}"


def _tasks(reply: dict[str, list[dict[str, Any]]] | None) -> list[dict[str, Any]]:
    return [
        {"worker": worker, "task_id": task["id"], "name": task["name"], "args": task["args"]}
        for worker, tasks_ in (reply or {}).items()
        for task in tasks_
    ]


def queue_overview(timeout: float = QUEUE_REPLY_TIMEOUT_S) -> dict[str, Any]:
    """Workers online, the tasks they run (``active``) and hold (``reserved``), the job
    counts of the database, and the equivalent ``celery`` commands.

    Takes about ``timeout`` seconds: one broadcast (``queue_state``, defined by the workers)
    that every online worker answers with both lists.
    """
    replies = celery_app().control.broadcast("queue_state", reply=True, timeout=timeout) or []
    states = {
        worker: state
        for reply in replies
        for worker, state in reply.items()
        if isinstance(state, dict)
    }
    online = sorted(states)
    return {
        **queue_counts(),
        "workers": online,
        "workers_online": len(online),
        "active": _tasks({w: states[w].get("active", []) for w in online}),
        "reserved": _tasks({w: states[w].get("reserved", []) for w in online}),
    }


def queue_counts() -> dict[str, Any]:
    """What the queue view knows without asking the workers (milliseconds): the broker,
    the database's queued / running / cancelling job counts and the ``celery`` commands."""
    from workers.app import repository

    repo = repository()
    return {
        "broker": _broker(Settings.from_env()),
        "jobs": {
            status.value: repo.count_jobs(status=status)
            for status in (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING)
        },
        "commands": COMMANDS,
    }
