"""Policy versions: recording them (strictly increasing per job) and reading them back."""

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.errors import InvalidValue, VersionConflict, VersionNotFound
from db.models import Job, PolicyVersion
from db.records import METRIC_TYPES, PolicyMetrics, PolicyVersionInfo, PolicyVersionRecord
from db.repository.base import (
    RepositoryBase,
    check_finite,
    check_json,
    check_non_negative,
    load_job,
    lock_job,
    require_active,
)


def version_info(row: PolicyVersion) -> PolicyVersionInfo:
    return PolicyVersionInfo(
        job_id=row.job_id,
        version=row.version,
        parent_version=row.parent_version,
        checkpoint_path=row.checkpoint_path,
        weights_checksum=row.weights_checksum,
        metrics=PolicyMetrics(
            **{name: getattr(row, name) for name in METRIC_TYPES}, extra=row.extra_metrics
        ),
        created_at=row.created_at,
    )


def _check_metrics(metrics: PolicyMetrics) -> None:
    for name, kind in METRIC_TYPES.items():
        value = getattr(metrics, name)
        if kind is float:
            check_finite(value, f"metrics.{name}")
        elif value is not None:
            check_non_negative(value, f"metrics.{name}")
    check_json(dict(metrics.extra), "metrics.extra")


def _has_version(session: Session, job_id: int, version: int) -> bool:
    statement = select(PolicyVersion.id).where(
        PolicyVersion.job_id == job_id, PolicyVersion.version == version
    )
    return session.scalar(statement) is not None


def check_version(record: PolicyVersionRecord) -> None:
    """The checks of a version record that need no database."""
    check_non_negative(record.version, "version")
    if record.parent_version is not None and record.parent_version >= record.version:
        raise InvalidValue(
            f"parent_version: {record.parent_version} is not below version {record.version}"
        )
    _check_metrics(record.metrics)


def insert_version(session: Session, job: Job, record: PolicyVersionRecord) -> PolicyVersion:
    """Add a checked version record of ``job`` (locked by the caller) and make it current.

    Raises `VersionConflict` unless the version is greater than every version the job
    already has, and `VersionNotFound` for an unknown ``parent_version``.
    """
    latest = session.scalar(
        select(func.max(PolicyVersion.version)).where(PolicyVersion.job_id == job.id)
    )
    if latest is not None and record.version <= latest:
        raise VersionConflict(job.id, record.version, latest)
    if record.parent_version is not None and not _has_version(
        session, job.id, record.parent_version
    ):
        raise VersionNotFound(job.id, record.parent_version)
    metrics = record.metrics
    row = PolicyVersion(
        job_id=job.id,
        version=record.version,
        parent_version=record.parent_version,
        checkpoint_path=record.checkpoint_path,
        weights_checksum=record.weights_checksum,
        **{name: getattr(metrics, name) for name in METRIC_TYPES},
        extra_metrics=dict(metrics.extra),
    )
    session.add(row)
    session.flush()
    job.current_version = record.version
    return row


class VersionsMixin(RepositoryBase):
    def record_policy_version(
        self, record: PolicyVersionRecord, *, fence: int | None = None
    ) -> PolicyVersionInfo:
        """Store a new version of a running job's policy and make it the job's current one.

        Raises `VersionConflict` unless the version is greater than every version the job
        already has, and `VersionNotFound` for an unknown ``parent_version``.
        """
        check_version(record)
        with self._write() as session:
            job = lock_job(session, record.job_id, fence)
            require_active(job, "record a policy version")
            return version_info(insert_version(session, job, record))

    def latest_version(self, job_id: int) -> PolicyVersionInfo | None:
        """The job's highest recorded version, or None if it has none yet."""
        with self._read() as session:
            load_job(session, job_id)
            row = session.scalars(
                select(PolicyVersion)
                .where(PolicyVersion.job_id == job_id)
                .order_by(PolicyVersion.version.desc())
                .limit(1)
            ).one_or_none()
            return None if row is None else version_info(row)

    def get_version(self, job_id: int, version: int) -> PolicyVersionInfo | None:
        """The job's recorded ``version``, or None if it has no such version."""
        with self._read() as session:
            load_job(session, job_id)
            row = session.scalars(
                select(PolicyVersion).where(
                    PolicyVersion.job_id == job_id, PolicyVersion.version == version
                )
            ).one_or_none()
            return None if row is None else version_info(row)

    def list_versions(self, job_id: int) -> list[PolicyVersionInfo]:
        """The job's recorded versions, oldest first."""
        with self._read() as session:
            load_job(session, job_id)
            rows = session.scalars(
                select(PolicyVersion)
                .where(PolicyVersion.job_id == job_id)
                .order_by(PolicyVersion.version)
            )
            return [version_info(row) for row in rows]
