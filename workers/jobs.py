"""Run one job by id: the lifecycle around the runners (attempts, ownership, status, failures)
and its heartbeat; what a running job consults between steps is `workers.control`.

Plain functions, no Celery: the tasks, ``rlwb train`` and the tests call `run_job`. Torch-free:
the runners (`workers.training`, `workers.evaluation`) are imported when a job runs.
"""

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from core_engine.rl.data import DataError
from db import InvalidTransition, JobInfo, JobKind, JobStatus, Repository, StaleOwner, StorageError
from workers.control import JobControl, Outcome, ProgressFn, Stop
from workers.job_files import check_output_dir, check_paths
from workers.settings import Settings
from workers.specs import SpecError, check_sizes
from workers.study_queue import job_ended

log = logging.getLogger(__name__)


@contextmanager
def heartbeat(repo: Repository, job_id: int, fence: int, interval: float) -> Iterator[None]:
    """Beat while the block runs."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(interval):
            try:
                repo.heartbeat(job_id, fence)
            except StaleOwner:
                return  # the job was taken: the runner sees it at its next stop check
            except Exception as exc:  # the database is briefly unreachable: try again
                log.warning("job %s: heartbeat failed: %s", job_id, exc)

    thread = threading.Thread(target=beat, name=f"heartbeat-{job_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


# Errors that mean "this job cannot run as configured", reported without a traceback
# (`workers.training.ResumeError` is a ValueError).
EXPECTED_ERRORS = (SpecError, DataError, StorageError, ValueError, OSError)


def run_job(
    repo: Repository,
    job_id: int,
    settings: Settings,
    task_id: str | None = None,
    progress: ProgressFn | None = None,
    queued: bool = False,
) -> Outcome:
    """Run (or resume) job ``job_id`` and record how it ended.

    Idempotent per job: a finished job, or one that another Celery task now owns, is left
    alone. Each start is an attempt with its own fencing token; an attempt handed back by a
    warm shutdown does not count, and past ``settings.max_attempts`` the job fails. A
    ``queued`` job (from the broker, not ``rlwb train``) has its sizes and files re-checked.
    """
    try:
        job = repo.start_attempt(job_id, task_id)
    except InvalidTransition:  # another task owns the job (recovery re-queued it)
        return Outcome("interrupted", stop=Stop.LOST)
    if job.status.is_terminal:
        return Outcome(job.status.value, job.error)
    control = JobControl(repo, job_id, job.fence, progress)
    if job.attempts > settings.max_attempts:
        error = f"gave up after {job.attempts - 1} attempts (the worker was lost while running it)"
        return finish(control, Outcome("failed", error))
    if job.cancel_requested:
        return finish(control, Outcome("cancelled"))
    try:
        job = repo.mark_running(job_id, celery_task_id=task_id, fence=job.fence)
    except InvalidTransition:  # cancelled while starting
        job = repo.get_job(job_id)
        return Outcome(job.status.value, job.error)
    with heartbeat(repo, job_id, control.fence, settings.heartbeat_interval_s):
        outcome = _run(repo, job, settings, control, queued)
    outcome = finish(control, outcome)
    if job.study_id is not None and outcome.stop is None:
        try:
            job_ended(repo, job_id)  # its trial told, the study's next jobs sent
        except Exception:  # the job's own record is complete: its study waits for a resume
            log.exception("job %s ended; its study was not advanced (rlwb study resume)", job_id)
    return outcome


def _runner(kind: JobKind) -> Callable[[Repository, JobInfo, Settings, JobControl], Outcome]:
    """The runner of a job kind (imported here, in the worker: they load torch)."""
    from workers.evaluation import run_compare, run_evaluate
    from workers.training import run_training

    return {JobKind.TRAIN: run_training, JobKind.EVALUATE: run_evaluate}.get(kind, run_compare)


def _run(
    repo: Repository, job: JobInfo, settings: Settings, control: JobControl, queued: bool
) -> Outcome:
    try:
        if queued:
            check_sizes(job.kind, job.config)
            check_paths(job.config, settings)
            check_output_dir(job.config, settings, repo, job.id)
        return _runner(job.kind)(repo, job, settings, control)
    except StaleOwner:
        return Outcome("interrupted", stop=Stop.LOST)
    except EXPECTED_ERRORS as exc:
        return Outcome("failed", f"{type(exc).__name__}: {exc}")
    except Exception as exc:
        log.exception("job %s failed", job.id)
        return Outcome("failed", f"internal error: {type(exc).__name__}: {exc}")


def finish(control: JobControl, outcome: Outcome) -> Outcome:
    """Write the final status, as the attempt's owner. An interrupted job stays running for
    its next attempt; one handed back by a warm shutdown is released (no attempt used)."""
    repo, job_id, fence = control.repo, control.job_id, control.fence
    try:
        if outcome.status == JobStatus.SUCCEEDED:
            repo.mark_succeeded(job_id, fence=fence)
        elif outcome.status == JobStatus.CANCELLED:
            repo.mark_cancelled(job_id, fence=fence)
        elif outcome.status == JobStatus.FAILED:
            repo.mark_failed(job_id, outcome.error or "failed", fence=fence)
        elif outcome.status == JobStatus.STALLED:
            repo.mark_stalled(job_id, outcome.error or "stalled", fence=fence)
        elif outcome.status == JobStatus.PRUNED:
            repo.mark_pruned(job_id, outcome.error or "pruned", fence=fence)
        elif outcome.stop is Stop.SHUTDOWN:
            repo.release(job_id, fence)
    except StaleOwner:
        return Outcome("interrupted", stop=Stop.LOST)
    return outcome
