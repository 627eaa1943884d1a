"""Putting jobs on the queue and taking them off: validate and submit, cancel, resume.

Shared by `workers.api` (the UI's door) and `workers.commands` (``rlwb submit``, ``cancel``,
``resume``), which import it and not each other. Imports no torch; Celery is configured on
first use, not at import.
"""

import dataclasses
from typing import Any

from celery import Celery

from core_engine.rl.objective.choices import trl_names_as_ours
from db import JobInfo, JobKind, JobStatus
from workers.job_files import (
    absolute_paths,
    check_data_records,
    check_output_dir,
    check_paths,
)
from workers.settings import Settings
from workers.specs import (
    SpecError,
    check_sizes,
    check_trackers_installed,
    validate,
)
from workers.study_queue import advance_study


def celery_app() -> Celery:
    """The Celery app with the tasks registered."""
    from workers import tasks

    return tasks.app


def validate_job(kind: JobKind | str, config: dict[str, Any]) -> int | None:
    """Check a job config and its sizes as the worker will, and that the trackers it reports
    to are installed (`SpecError`); returns its total steps."""
    total_steps = validate(kind, config)
    check_sizes(kind, config)
    check_trackers_installed(config)
    return total_steps


def submit_job(kind: JobKind | str, config: dict[str, Any]) -> JobInfo:
    """Store ``config`` as a queued job (`create_checked_job`) and send its task to the
    ``gpu`` queue."""
    from workers.app import repository

    repo = repository()
    return _queued(repo, create_checked_job(repo, kind, config))


def create_checked_job(repo: Any, kind: JobKind | str, config: dict[str, Any]) -> JobInfo:
    """Validate ``config`` (see `workers.specs`; raises `SpecError`, storing nothing), TRL's
    names for ours and its relative paths made absolute here (`our_names`,
    `absolute_paths`), and store it as a queued job: the one pre-flight of ``rlwb submit``,
    ``rlwb train`` and the UI."""

    if isinstance(config, dict):
        config = absolute_paths(our_names(config) if JobKind(kind) is JobKind.TRAIN else config)
    total_steps = validate_job(kind, config)
    settings = Settings.from_env()
    check_paths(config, settings)
    check_output_dir(config, settings, repo)
    if JobKind(kind) is JobKind.TRAIN:
        check_data_records(config)
    return repo.create_job(kind, config, total_steps=total_steps)


def cancel_job(job_id: int) -> JobInfo:
    """Cancel a job: a queued one at once (and its task is revoked), a running one at its
    next step (it ends ``cancelled`` with everything so far kept)."""
    from workers.app import repository

    repo = repository()
    job = repo.request_cancel(job_id)
    if job.status is JobStatus.CANCELLED and job.celery_task_id:
        celery_app().control.revoke(job.celery_task_id)
    if job.status is JobStatus.CANCELLED and job.study_id is not None:
        advance_study(celery_app(), repo, job.study_id)  # its slot is free
    return job


def resume_job(job_id: int) -> JobInfo:
    """Queue a failed, stalled, pruned or cancelled train job again: it continues from its
    newest checkpoint at that version (`db.InvalidTransition` for any other job)."""
    from workers.app import repository

    repo = repository()
    return _queued(repo, repo.reopen(job_id))


def _queued(repo: Any, job: JobInfo) -> JobInfo:
    """Send the task of the queued `job`; returns it as queued, with its task id (not read
    back: a worker may already have taken it, and the caller reports what it did)."""
    from workers.app import enqueue

    return dataclasses.replace(job, celery_task_id=enqueue(celery_app(), repo, job))


def our_names(config: dict[str, Any]) -> dict[str, Any]:
    """A train job's config with TRL's names (`num_generations`, `beta`, ...) as ours, so the
    stored job, its checks and Clone all read one spelling; `SpecError` for a TRL name with no
    equal here."""
    try:
        return trl_names_as_ours(config)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
