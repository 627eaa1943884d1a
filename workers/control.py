"""What a running job consults between steps: one attempt's `JobControl` (stop?, progress),
why it stops (`Stop`), how it ended (`Outcome`), and the worker's shutdown flag; and what a
running interactive task consults: whether it was revoked (`revoked`).

Shared by the lifecycle (`workers.jobs`) and the runners (`workers.training`,
`workers.evaluation`), which import it and not each other.
"""

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from db import Repository

ProgressFn = Callable[[dict[str, Any]], None]

# Set when the worker begins a warm shutdown: running jobs stop at their next step and are
# handed back to the queue (they resume from their last version).
SHUTTING_DOWN = threading.Event()


def revoked(task_id: str | None) -> Callable[[], bool]:
    """Whether task ``task_id`` has been revoked since: a ``revoke`` this worker received
    (e.g. the UI's, when it stops waiting for a Playground reply). A task of the threads pool
    cannot be terminated: it asks this between its steps and stops itself."""
    from celery.worker import state

    return lambda: task_id is not None and task_id in state.revoked


class Stop(enum.StrEnum):
    CANCEL = "cancel"  # the user asked (cancel_requested on the job row)
    SHUTDOWN = "shutdown"  # this worker is shutting down: requeue
    LOST = "lost"  # this attempt no longer owns the job (recovery or a new attempt took it)


@dataclass(frozen=True)
class Outcome:
    """How a run ended: ``succeeded``, ``cancelled``, ``failed``, ``stalled`` or ``pruned``
    (with ``error``: what went wrong, why there was nothing left to learn, or why its study's
    pruner stopped it), or ``interrupted``
    (``stop`` says why; the job stays running for its next attempt)."""

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
