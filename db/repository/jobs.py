"""Jobs: creation, progress, status transitions, cancellation, deletion."""

from typing import Any

from sqlalchemy import Select, func, select

from db.enums import JobKind, JobStatus, coerce
from db.errors import InvalidTransition, InvalidValue
from db.models import Job
from db.records import JobInfo
from db.repository.base import (
    RepositoryBase,
    check_json,
    check_limit,
    load_job,
    lock_job,
    require_active,
)
from db.timestamps import database_now, utcnow

# The statuses each status may be entered from. RUNNING -> RUNNING is a redelivered task
# (the worker died; Celery runs it again).
_ENTERED_FROM: dict[JobStatus, tuple[JobStatus, ...]] = {
    JobStatus.RUNNING: (JobStatus.QUEUED, JobStatus.RUNNING),
    JobStatus.SUCCEEDED: (JobStatus.RUNNING, JobStatus.CANCELLING),
    JobStatus.FAILED: (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING),
    JobStatus.STALLED: (JobStatus.RUNNING, JobStatus.CANCELLING),
    JobStatus.PRUNED: (JobStatus.RUNNING, JobStatus.CANCELLING),
    JobStatus.CANCELLED: (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.CANCELLING),
}
# What `Repository.reopen` may queue again (a train job continues from its newest version).
_RESUMABLE = (JobStatus.FAILED, JobStatus.STALLED, JobStatus.CANCELLED, JobStatus.PRUNED)


def job_info(job: Job) -> JobInfo:
    return JobInfo(
        id=job.id,
        kind=job.kind,
        status=job.status,
        config=job.config,
        step=job.step,
        total_steps=job.total_steps,
        current_version=job.current_version,
        error=job.error,
        celery_task_id=job.celery_task_id,
        attempts=job.attempts,
        cancel_requested=job.cancel_requested,
        created_at=job.created_at,
        updated_at=job.updated_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        fence=job.fence,
        heartbeat_at=job.heartbeat_at,
        phase=job.phase,
        base_checksum=job.base_checksum,
        study_id=job.study_id,
        study_point=job.study_point,
        study_trial=job.study_trial,
    )


def _enter(job: Job, status: JobStatus) -> None:
    if job.status not in _ENTERED_FROM[status]:
        raise InvalidTransition(job.id, job.status.value, f"become {status.value!r}")
    job.status = status
    if status is JobStatus.RUNNING and job.started_at is None:
        job.started_at = utcnow()
    if status.is_terminal:
        job.finished_at = utcnow()


class JobsMixin(RepositoryBase):
    def create_job(
        self, kind: JobKind | str, config: dict[str, Any], *, total_steps: int | None = None
    ) -> JobInfo:
        """A new ``queued`` job. ``config`` is any JSON object (the job's settings)."""
        if not isinstance(config, dict):
            raise InvalidValue(f"config: expected a JSON object, got {type(config).__name__}")
        check_json(config, "config")
        if total_steps is not None and total_steps < 0:
            raise InvalidValue(f"total_steps: {total_steps} is negative")
        job = Job(
            kind=coerce(JobKind, kind, "kind"),
            status=JobStatus.QUEUED,
            config=config,
            total_steps=total_steps,
        )
        with self._write() as session:
            session.add(job)
            session.flush()
            return job_info(job)

    def get_job(self, job_id: int) -> JobInfo:
        with self._read() as session:
            return job_info(load_job(session, job_id))

    def list_jobs(
        self,
        *,
        limit: int = 100,
        status: JobStatus | str | None = None,
        kind: JobKind | str | None = None,
    ) -> list[JobInfo]:
        """Jobs, newest first."""
        check_limit(limit)
        statement = _of(select(Job), status, kind).order_by(Job.id.desc()).limit(limit)
        with self._read() as session:
            return [job_info(job) for job in session.scalars(statement)]

    def count_jobs(
        self, status: JobStatus | str | None = None, kind: JobKind | str | None = None
    ) -> int:
        """How many jobs there are (of ``status`` and ``kind``, if given)."""
        statement = _of(select(func.count()).select_from(Job), status, kind)
        with self._read() as session:
            return session.scalar(statement)

    def output_dirs(self) -> dict[int, str]:
        """job id -> the ``output_dir`` its config names, for every train job that names one."""
        statement = select(Job.id, Job.config).where(Job.kind == JobKind.TRAIN)
        with self._read() as session:
            rows = session.execute(statement).all()
        named = {job_id: config.get("output_dir") for job_id, config in rows}
        return {
            job_id: folder for job_id, folder in named.items() if folder and isinstance(folder, str)
        }

    def set_celery_task_id(self, job_id: int, celery_task_id: str) -> JobInfo:
        """Remember the Celery task that runs the job (to revoke it while queued)."""
        with self._write() as session:
            job = load_job(session, job_id, for_update=True)
            job.celery_task_id = celery_task_id
            session.flush()
            return job_info(job)

    def update_progress(
        self,
        job_id: int,
        step: int,
        total_steps: int | None = None,
        *,
        fence: int | None = None,
        phase: str | None = None,
    ) -> JobInfo:
        """Record the step a running job has reached and its ``phase`` (what it does before
        its steps, e.g. a warm-up; None: none), and, with ``fence``, that its owner is alive.
        The result's ``cancel_requested`` tells the worker whether to stop."""
        with self._write() as session:
            job = lock_job(session, job_id, fence)
            require_active(job, "update progress")
            if fence is not None:
                job.heartbeat_at = database_now(session)
            total = job.total_steps if total_steps is None else total_steps
            if step < 0 or (total is not None and step > total):
                raise InvalidValue(f"step: {step} is outside 0..{total}")
            job.step = step
            job.total_steps = total
            job.phase = phase
            session.flush()
            return job_info(job)

    def record_base_checksum(
        self, job_id: int, checksum: str, *, fence: int | None = None
    ) -> JobInfo:
        """Record the checksum of a running LoRA job's base checkpoint, once: the same one
        again is a no-op, another one is refused (`InvalidValue`: the base changed)."""
        with self._write() as session:
            job = lock_job(session, job_id, fence)
            require_active(job, "record its base checksum")
            if job.base_checksum not in (None, checksum):
                raise InvalidValue(
                    f"base_checksum: job {job_id} was trained on a base with checksum "
                    f"{job.base_checksum[:12]}, not {checksum[:12]}"
                )
            job.base_checksum = checksum
            session.flush()
            return job_info(job)

    def request_cancel(self, job_id: int) -> JobInfo:
        """Ask for cancellation: a queued job is cancelled at once, a running job becomes
        ``cancelling`` until its worker stops. Finished jobs are left as they are."""
        with self._write() as session:
            job = load_job(session, job_id, for_update=True)
            if job.status is JobStatus.QUEUED:
                _enter(job, JobStatus.CANCELLED)
                job.cancel_requested = True
            elif job.status is JobStatus.RUNNING:
                job.status = JobStatus.CANCELLING
                job.cancel_requested = True
            session.flush()
            return job_info(job)

    def cancel_tasks(self, celery_task_ids: set[str]) -> list[JobInfo]:
        """`request_cancel` for the jobs whose current task is one of ``celery_task_ids`` (a
        revoked task: the database remembers it across worker restarts)."""
        statement = select(Job.id).where(Job.celery_task_id.in_(sorted(celery_task_ids)))
        with self._read() as session:
            ids = list(session.scalars(statement))
        return [self.request_cancel(job_id) for job_id in ids]

    def mark_running(
        self, job_id: int, *, celery_task_id: str | None = None, fence: int | None = None
    ) -> JobInfo:
        with self._write() as session:
            job = lock_job(session, job_id, fence)
            _enter(job, JobStatus.RUNNING)
            if celery_task_id is not None:
                job.celery_task_id = celery_task_id
            session.flush()
            return job_info(job)

    def mark_succeeded(self, job_id: int, *, fence: int | None = None) -> JobInfo:
        return self._finish(job_id, JobStatus.SUCCEEDED, None, fence)

    def mark_failed(self, job_id: int, error: str, *, fence: int | None = None) -> JobInfo:
        return self._finish(job_id, JobStatus.FAILED, error, fence)

    def mark_stalled(self, job_id: int, reason: str, *, fence: int | None = None) -> JobInfo:
        """End a job that stopped early with nothing broken (no learning signal left), with
        the ``reason`` shown as its error."""
        return self._finish(job_id, JobStatus.STALLED, reason, fence)

    def mark_pruned(self, job_id: int, reason: str, *, fence: int | None = None) -> JobInfo:
        """End a study's job that its pruner stopped at a step boundary (everything so far
        kept; resumable), with the ``reason`` shown as its error."""
        return self._finish(job_id, JobStatus.PRUNED, reason, fence)

    def mark_cancelled(
        self, job_id: int, error: str | None = None, *, fence: int | None = None
    ) -> JobInfo:
        return self._finish(job_id, JobStatus.CANCELLED, error, fence)

    def _finish(
        self, job_id: int, status: JobStatus, error: str | None, fence: int | None
    ) -> JobInfo:
        with self._write() as session:
            job = lock_job(session, job_id, fence)
            _enter(job, status)
            job.error = error
            session.flush()
            return job_info(job)

    def reopen(self, job_id: int) -> JobInfo:
        """Queue a failed, stalled, pruned or cancelled train job again, to continue from its newest
        version: a fresh count of attempts, no error, no cancel request (`InvalidTransition`
        for any other job)."""
        with self._write() as session:
            job = load_job(session, job_id, for_update=True)
            resumable = job.status in _RESUMABLE
            if not resumable or job.kind is not JobKind.TRAIN:
                raise InvalidTransition(job.id, job.status.value, f"resume a {job.kind} job")
            job.status, job.attempts, job.error = JobStatus.QUEUED, 0, None
            job.cancel_requested, job.finished_at = False, None
            session.flush()
            return job_info(job)

    def delete_job(self, job_id: int) -> None:
        """Delete a job with its versions, batches and samples. A running (or cancelling)
        job is refused: cancel it, or mark it failed, first."""
        with self._write() as session:
            job = load_job(session, job_id, for_update=True)
            if job.status in (JobStatus.RUNNING, JobStatus.CANCELLING):
                raise InvalidTransition(job.id, job.status.value, "be deleted")
            session.delete(job)


def _of(statement: Select, status: JobStatus | str | None, kind: JobKind | str | None) -> Select:
    """``statement`` narrowed to the jobs of ``status`` and ``kind`` (None: any)."""
    if status is not None:
        statement = statement.where(Job.status == coerce(JobStatus, status, "status"))
    if kind is not None:
        statement = statement.where(Job.kind == coerce(JobKind, kind, "kind"))
    return statement
