"""Training steps: a step's batches and the policy version it produced, in one transaction."""

from collections.abc import Sequence

from db.errors import InvalidValue
from db.records import BatchRecord, PolicyVersionRecord, StepInfo
from db.repository.base import RepositoryBase, lock_job, require_active
from db.repository.batch_rows import ValidBatch, check_batch
from db.repository.batches import batch_info, insert_batch
from db.repository.versions import check_version, insert_version, version_info


def _step_job(batches: Sequence[BatchRecord], version: PolicyVersionRecord | None) -> int:
    """The one job that every record of the step belongs to."""
    jobs = {batch.job_id for batch in batches}
    if version is not None:
        jobs.add(version.job_id)
    if not jobs:
        raise InvalidValue("a step needs at least one batch or a policy version")
    if len(jobs) > 1:
        raise InvalidValue(f"a step belongs to one job; got jobs {sorted(jobs)}")
    return jobs.pop()


def _checked(index: int, batch: BatchRecord) -> ValidBatch:
    try:
        return check_batch(batch)
    except InvalidValue as exc:
        raise InvalidValue(f"batches[{index}]: {exc}") from None


class StepsMixin(RepositoryBase):
    def record_step(
        self,
        batches: Sequence[BatchRecord],
        version: PolicyVersionRecord | None,
        *,
        fence: int | None = None,
    ) -> StepInfo:
        """Store one training step atomically: its batches (say the accepted groups and the
        rejected ones) and, if the step produced one, the new policy version (made the job's
        current version). On any error nothing of the step is stored.

        Each batch is checked as by `record_batch` and the version as by
        `record_policy_version`; all of them must belong to the same job. With ``fence``,
        only the attempt holding that fencing token may write (`StaleOwner`).
        """
        job_id = _step_job(batches, version)
        valid = [_checked(i, batch) for i, batch in enumerate(batches)]
        if version is not None:
            check_version(version)
        with self._write() as session:
            job = lock_job(session, job_id, fence)
            require_active(job, "record a training step")
            rows = [insert_batch(session, job, batch) for batch in valid]
            version_row = None if version is None else insert_version(session, job, version)
            return StepInfo(
                batches=[batch_info(row) for row in rows],
                version=None if version_row is None else version_info(version_row),
            )
