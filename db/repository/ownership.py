"""Who runs a job: attempts and their fencing tokens, heartbeats, clean hand-backs, recovery
from a stale owner, and dropping what an interrupted attempt stored after its last version.

Every write of a worker carries the fencing token its attempt started with (``fence=``); the
token is checked in the transaction of the write (`lock_job`), so once recovery or a new
attempt has taken the job, the old owner cannot store anything more. Heartbeats are written
and judged by the database server's clock (`database_now`), never a worker's: a worker whose
clock runs ahead cannot take a healthy job, nor one whose clock runs behind lose its own.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

from sqlalchemy import delete, select

from db.enums import BatchStatus, JobStatus
from db.errors import InvalidTransition
from db.models import RolloutBatch, Sample
from db.records import JobInfo
from db.repository.base import ACTIVE_STATUSES, RepositoryBase, load_job, lock_job
from db.repository.jobs import job_info
from db.repository.stats import add_samples
from db.timestamps import database_now, utcnow

_STAT_COLUMNS = (Sample.policy_version, Sample.finish_reason, Sample.response_length, Sample.reward)


class OwnershipMixin(RepositoryBase):
    def start_attempt(self, job_id: int, celery_task_id: str | None = None) -> JobInfo:
        """Take the job for a new attempt: one more attempt, a new fencing token (``fence``
        of the result) and a fresh heartbeat. A finished job is returned unchanged; a job
        another Celery task owns is refused (`InvalidTransition`)."""
        with self._write() as session:
            job = load_job(session, job_id, for_update=True)
            if job.status.is_terminal:
                return job_info(job)
            if celery_task_id is not None and job.celery_task_id not in (None, celery_task_id):
                raise InvalidTransition(
                    job.id, job.status.value, f"be started by task {celery_task_id}"
                )
            job.attempts += 1
            job.fence += 1
            job.heartbeat_at = database_now(session)
            if celery_task_id is not None:
                job.celery_task_id = celery_task_id
            session.flush()
            return job_info(job)

    def heartbeat(self, job_id: int, fence: int) -> JobInfo:
        """The owner is alive (`StaleOwner` once it is not the owner any more)."""
        with self._write() as session:
            job = lock_job(session, job_id, fence)
            job.heartbeat_at = database_now(session)
            session.flush()
            return job_info(job)

    @contextmanager
    def owning(self, job_id: int, fence: int) -> Iterator[None]:
        """Run the block as the job's owner: `StaleOwner` unless attempt ``fence`` still owns
        the job, which stays locked until the block ends (recovery and a new attempt wait),
        so what the block does on disk can never interleave with a newer owner's work."""
        with self._write() as session:
            lock_job(session, job_id, fence)
            yield

    def release(self, job_id: int, fence: int) -> JobInfo:
        """A clean hand-back (the worker is shutting down): the attempt does not count, the
        owner gives up its token, and recovery may re-queue the job at once."""
        with self._write() as session:
            job = lock_job(session, job_id, fence)
            job.attempts = max(job.attempts - 1, 0)
            job.fence += 1
            job.heartbeat_at = None
            session.flush()
            return job_info(job)

    def requeue_stale(self, job_id: int, timeout_s: float, task_id: str) -> JobInfo | None:
        """Recovery: a running job whose owner released it or gave no heartbeat in the last
        ``timeout_s`` seconds of the database's clock is taken from that owner (a new fencing
        token) and queued again under ``task_id`` (a cancelling one is cancelled instead).
        None: the owner is alive."""
        with self._write() as session:
            job = load_job(session, job_id, for_update=True)
            beat = job.heartbeat_at
            older_than = database_now(session) - timedelta(seconds=timeout_s)
            if job.status not in ACTIVE_STATUSES or (beat is not None and beat > older_than):
                return None
            job.fence += 1
            job.heartbeat_at = None
            if job.cancel_requested:
                job.status, job.finished_at = JobStatus.CANCELLED, utcnow()
            else:
                job.status, job.celery_task_id = JobStatus.QUEUED, task_id
            session.flush()
            return job_info(job)

    def discard_unversioned(
        self, job_id: int, version: int, fence: int | None = None, keep: int = 0
    ) -> int:
        """Delete the rejected batches stored at ``version`` or later (and their samples) but
        the ``keep`` first: what an interrupted attempt recorded after the checkpoint the job
        resumes from (which counts the batches it kept). The retried steps store them again,
        so a retry replaces, never adds. Returns how many were deleted."""
        with self._write() as session:
            job = lock_job(session, job_id, fence)
            ids = list(
                session.scalars(
                    select(RolloutBatch.id)
                    .where(
                        RolloutBatch.job_id == job.id,
                        RolloutBatch.policy_version >= version,
                        RolloutBatch.status == BatchStatus.REJECTED,
                    )
                    .order_by(RolloutBatch.id)
                    .offset(keep)
                )
            )
            if ids:
                rows = session.execute(select(*_STAT_COLUMNS).where(Sample.batch_id.in_(ids)))
                add_samples(session, job.id, [row._asdict() for row in rows], sign=-1)
                session.execute(delete(Sample).where(Sample.batch_id.in_(ids)))
                session.execute(delete(RolloutBatch).where(RolloutBatch.id.in_(ids)))
            return len(ids)
