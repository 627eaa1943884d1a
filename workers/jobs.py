"""Run one job by id: the lifecycle around the runners (attempts, ownership, status, failures),
what a running job consults between steps (`JobControl`: stop?, progress) and its heartbeat.

Plain functions, no Celery: the tasks, ``rlwb train`` and the tests call `run_job`. Torch-free:
the runners (`workers.training`, `workers.evaluation`) are imported when a job runs.
"""

import enum
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from core_engine.rl.data import DataError
from db import InvalidTransition, JobInfo, JobKind, JobStatus, Repository, StaleOwner, StorageError
from workers.settings import Settings
from workers.specs import SpecError, check_paths, check_sizes

log = logging.getLogger(__name__)

ProgressFn = Callable[[dict[str, Any]], None]

# Set when the worker begins a warm shutdown: running jobs stop at their next step and are
# handed back to the queue (they resume from their last version).
SHUTTING_DOWN = threading.Event()


class Stop(enum.StrEnum):
    CANCEL = "cancel"  # the user asked (cancel_requested on the job row)
    SHUTDOWN = "shutdown"  # this worker is shutting down: requeue
    LOST = "lost"  # this attempt no longer owns the job (recovery or a new attempt took it)


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``succeeded``, ``cancelled``, ``failed`` (with ``error``), or
    ``interrupted`` (``stop`` says why; the job stays running for its next attempt)."""

    status: str
    error: str | None = None
    stop: Stop | None = None


class JobControl:
    """One attempt at a job: its fencing token (``fence``, passed with every write), whether
    to stop, and where progress goes."""

    def __init__(
        self,
        repo: Repository,
        job_id: int,
        fence: int,
        progress: ProgressFn | None = None,
    ) -> None:
        self.repo = repo
        self.job_id = job_id
        self.fence = fence
        self.progress = progress

    def stop_reason(self) -> Stop | None:
        """Why the job should stop now (one read of the job row), or None."""
        job = self.repo.get_job(self.job_id)
        if job.fence != self.fence:
            return Stop.LOST
        if job.cancel_requested:
            return Stop.CANCEL
        if SHUTTING_DOWN.is_set():
            return Stop.SHUTDOWN
        return None

    def should_stop(self) -> bool:
        return self.stop_reason() is not None

    def report(
        self, step: int, total_steps: int | None, phase: str | None = None, **meta: Any
    ) -> None:
        """Durable progress (and the ``phase`` before the steps, e.g. a warm-up) on the job
        row, plus a live ping to the caller (Celery state)."""
        self.repo.update_progress(self.job_id, step, total_steps, fence=self.fence, phase=phase)
        if self.progress is not None:
            ping = {"job_id": self.job_id, "step": step, "total_steps": total_steps, **meta}
            self.progress(ping if phase is None else {**ping, "phase": phase})

    def stopped(self) -> Outcome:
        """The outcome of a run that ended early because `stop_reason` said so."""
        reason = self.stop_reason()
        if reason is Stop.CANCEL:
            return Outcome("cancelled")
        return Outcome("interrupted", stop=reason)


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
    return finish(control, outcome)


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
        elif outcome.stop is Stop.SHUTDOWN:
            repo.release(job_id, fence)
    except StaleOwner:
        return Outcome("interrupted", stop=Stop.LOST)
    return outcome
