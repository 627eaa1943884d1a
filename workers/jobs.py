"""Run one job by id: the lifecycle around the runners (attempts, status, failures).

Plain functions, no Celery: the tasks, ``rlwb train`` and the tests call `run_job`.
"""

import logging

from core_engine.rl.data import DataError
from db import InvalidTransition, JobKind, JobStatus, Repository, StorageError
from workers.checkpoints import ResumeError
from workers.control import JobControl, Outcome, ProgressFn, Stop
from workers.evaluation import run_compare, run_evaluate
from workers.settings import Settings
from workers.specs import SpecError
from workers.training import run_training

log = logging.getLogger(__name__)

RUNNERS = {
    JobKind.TRAIN: run_training,
    JobKind.EVALUATE: run_evaluate,
    JobKind.COMPARE: run_compare,
}
# Errors that mean "this job cannot run as configured", reported without a traceback.
EXPECTED_ERRORS = (SpecError, ResumeError, DataError, StorageError, ValueError, OSError)


def run_job(
    repo: Repository,
    job_id: int,
    settings: Settings,
    task_id: str | None = None,
    progress: ProgressFn | None = None,
) -> Outcome:
    """Run (or resume) job ``job_id`` and record how it ended.

    Idempotent per job: a finished job, or one that another Celery task now owns, is left
    alone. Each start counts as an attempt; past ``settings.max_attempts`` the job fails.
    """
    job = repo.get_job(job_id)
    if job.status.is_terminal:
        return Outcome(job.status.value, job.error)
    if task_id is not None and job.celery_task_id not in (None, task_id):
        return Outcome("interrupted", stop=Stop.LOST)
    attempts = repo.increment_attempts(job_id)
    if attempts > settings.max_attempts:
        error = f"gave up after {attempts - 1} attempts (the worker was lost while running it)"
        return finish(repo, job_id, Outcome("failed", error))
    if job.cancel_requested:
        return finish(repo, job_id, Outcome("cancelled"))
    try:
        job = repo.mark_running(job_id, celery_task_id=task_id)
    except InvalidTransition:  # cancelled while starting
        job = repo.get_job(job_id)
        return Outcome(job.status.value, job.error)
    control = JobControl(repo, job_id, task_id, progress)
    try:
        outcome = RUNNERS[job.kind](repo, job, settings, control)
    except EXPECTED_ERRORS as exc:
        outcome = Outcome("failed", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        log.exception("job %s failed", job_id)
        outcome = Outcome("failed", f"internal error: {type(exc).__name__}: {exc}")
    return finish(repo, job_id, outcome)


def finish(repo: Repository, job_id: int, outcome: Outcome) -> Outcome:
    """Write the final status (an interrupted job stays running for its next attempt)."""
    if outcome.status == JobStatus.SUCCEEDED:
        repo.mark_succeeded(job_id)
    elif outcome.status == JobStatus.CANCELLED:
        repo.mark_cancelled(job_id)
    elif outcome.status == JobStatus.FAILED:
        repo.mark_failed(job_id, outcome.error or "failed")
    return outcome
