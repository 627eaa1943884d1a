"""Rollout batches: one batch and all its samples are written in one transaction."""

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from db.enums import BatchStatus, coerce
from db.errors import BatchNotFound
from db.models import Job, RolloutBatch, Sample
from db.records import BatchInfo, BatchRecord
from db.repository.base import RepositoryBase, check_limit, load_job, lock_job, require_active
from db.repository.batch_rows import ValidBatch, check_batch
from db.repository.stats import add_samples


def batch_info(row: RolloutBatch) -> BatchInfo:
    return BatchInfo(
        id=row.id,
        job_id=row.job_id,
        policy_version=row.policy_version,
        step=row.step,
        status=row.status,
        rejection_reasons=list(row.rejection_reasons),
        num_samples=row.num_samples,
        created_at=row.created_at,
    )


def insert_batch(session: Session, job: Job, valid: ValidBatch) -> RolloutBatch:
    """Add a checked batch of ``job`` (locked by the caller) with its samples and totals."""
    batch = valid.record
    row = RolloutBatch(
        job_id=job.id,
        policy_version=batch.policy_version,
        step=batch.step,
        status=valid.status,
        rejection_reasons=list(batch.rejection_reasons),
        num_samples=len(valid.rows),
    )
    session.add(row)
    session.flush()
    for sample_row in valid.rows:
        sample_row["batch_id"] = row.id
    session.execute(insert(Sample), valid.rows)
    add_samples(session, job.id, valid.rows)
    return row


class BatchesMixin(RepositoryBase):
    def record_batch(self, batch: BatchRecord, *, fence: int | None = None) -> BatchInfo:
        """Store a batch and all its samples atomically: on any error nothing is stored.
        With ``fence``, only the attempt holding that fencing token may write."""
        valid = check_batch(batch)
        with self._write() as session:
            job = lock_job(session, batch.job_id, fence)
            require_active(job, "record a rollout batch")
            return batch_info(insert_batch(session, job, valid))

    def get_batch(self, batch_id: int) -> BatchInfo:
        """One batch, or `BatchNotFound`."""
        with self._read() as session:
            row = session.get(RolloutBatch, batch_id)
            if row is None:
                raise BatchNotFound(batch_id)
            return batch_info(row)

    def list_batches(
        self,
        job_id: int,
        *,
        status: BatchStatus | str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[BatchInfo]:
        """The job's batches in the order they were recorded (``newest_first``: reversed),
        all of them or the first ``limit`` (1..`MAX_PAGE_SIZE`)."""
        statement = select(RolloutBatch).where(RolloutBatch.job_id == job_id)
        if status is not None:
            statement = statement.where(
                RolloutBatch.status == coerce(BatchStatus, status, "status")
            )
        order = RolloutBatch.id.desc() if newest_first else RolloutBatch.id
        statement = statement.order_by(order)
        if limit is not None:
            check_limit(limit)
            statement = statement.limit(limit)
        with self._read() as session:
            load_job(session, job_id)
            return [batch_info(row) for row in session.scalars(statement)]
