"""Several jobs read at once, for the Runs view: one query per metric across all of them."""

import json
from collections.abc import Sequence

from sqlalchemy import Connection, Float, Select, Text, case, cast, func, select, text
from sqlalchemy.dialects.postgresql import aggregate_order_by

from db.errors import InvalidValue
from db.models import Job, PolicyVersion, VersionSampleStats
from db.records import METRIC_TYPES, JobInfo, RunMetric
from db.repository.base import MAX_PAGE_SIZE, RepositoryBase
from db.repository.jobs import job_info

MAX_METRIC_NAME = 200
# The names of the metrics in a version's ``extra_metrics`` (a JSON object), per dialect.
_EXTRA_KEYS = {
    "sqlite": "SELECT DISTINCT key FROM policy_versions, json_each(extra_metrics) "
    "WHERE job_id IN ({ids})",
    "postgresql": "SELECT DISTINCT json_object_keys(extra_metrics) FROM policy_versions "
    "WHERE job_id IN ({ids})",
}


def _check_jobs(job_ids: Sequence[int]) -> list[int]:
    ids = list(dict.fromkeys(job_ids))
    if not 1 <= len(ids) <= MAX_PAGE_SIZE:
        raise InvalidValue(f"job_ids: choose 1 to {MAX_PAGE_SIZE} jobs (got {len(ids)})")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise InvalidValue("job_ids: whole numbers >= 0 only")
    return ids


def _epoch_seconds(dialect: str):
    """A version's ``created_at`` as seconds since the epoch, computed by the database (no
    timestamp objects to build per row)."""
    if dialect == "sqlite":  # stored as UTC text: 'YYYY-MM-DD HH:MM:SS.ffffff'
        return (func.julianday(PolicyVersion.created_at) - 2440587.5) * 86400.0
    return func.date_part("epoch", PolicyVersion.created_at)  # a float (EXTRACT: a numeric)


def _metric_column(metric: str):
    """The SQL expression of a named metric (a column) or of one in ``extra_metrics``. An
    extra metric is parsed out of the versions whose JSON text holds its name as the
    repository writes it (`json.dumps`, quoted and escaped) only: with a held-out score every
    few versions, the others are not parsed."""
    if not metric or len(metric) > MAX_METRIC_NAME:
        raise InvalidValue(f"metric: a name of 1 to {MAX_METRIC_NAME} characters is required")
    if metric in METRIC_TYPES:
        return cast(getattr(PolicyVersion, metric), Float)
    stored = cast(PolicyVersion.extra_metrics, Text)
    written = json.dumps(metric)  # as SQLAlchemy's JSON type writes a key
    return case(
        (stored.contains(written, autoescape=True), PolicyVersion.extra_metrics[metric].as_float())
    )


def _columns_per_job(connection: Connection, rows: Select) -> dict[int, list[list]]:
    """job -> each further column of ``rows`` (whose first column is the job and second the
    order within it) as a list in that order. On PostgreSQL a row per job of arrays
    (``array_agg``): 60 rows to read rather than 60,000; elsewhere the rows, grouped here."""
    if connection.dialect.name == "postgresql":
        inner = rows.subquery()
        job, order, *rest = inner.c
        arrays = [func.array_agg(aggregate_order_by(c, order)) for c in (order, *rest)]
        statement = select(job, *arrays).group_by(job)
        return {row[0]: [list(a) for a in row[1:]] for row in connection.execute(statement)}
    per_job: dict[int, list[list]] = {}
    job, order = rows.selected_columns[:2]
    for row in connection.execute(rows.order_by(job, order)):
        columns = per_job.setdefault(row[0], [[] for _ in row[1:]])
        for column, value in zip(columns, row[1:], strict=True):
            column.append(value)
    return per_job


class RunsMixin(RepositoryBase):
    def get_jobs(self, job_ids: Sequence[int]) -> list[JobInfo]:
        """The jobs of ``job_ids`` that exist, in the order given."""
        ids = _check_jobs(job_ids)
        with self._read() as session:
            found = {
                job.id: job_info(job) for job in session.scalars(select(Job).where(Job.id.in_(ids)))
            }
        return [found[i] for i in ids if i in found]

    def run_metrics(
        self, job_ids: Sequence[int], metrics: Sequence[str]
    ) -> dict[str, dict[int, RunMetric]]:
        """Each of ``metrics`` (a named column of the versions, or a key of their extra
        metrics) of each job that has recorded versions, read in one query across the jobs."""
        ids = _check_jobs(job_ids)
        names = list(dict.fromkeys(metrics))
        if not names:
            raise InvalidValue("metrics: name at least one")
        columns = [_metric_column(name).label(f"m{i}") for i, name in enumerate(names)]
        with self._read() as session:
            connection = session.connection()
            statement = select(
                PolicyVersion.job_id,
                PolicyVersion.version,
                _epoch_seconds(connection.dialect.name).label("seconds"),
                *columns,
            ).where(PolicyVersion.job_id.in_(ids))
            per_job = _columns_per_job(connection, statement)
        found: dict[str, dict[int, RunMetric]] = {name: {} for name in names}
        for job_id, (versions, stamps, *values) in per_job.items():
            start = float(stamps[0])
            seconds = [float(stamp) - start for stamp in stamps]
            for name, recorded in zip(names, values, strict=True):
                found[name][job_id] = RunMetric(job_id, versions, seconds, recorded)
        return found

    def final_values(self, job_ids: Sequence[int], metric: str) -> dict[int, tuple[int, float]]:
        """job -> (version, value) of ``metric`` at the job's highest version that recorded it
        (jobs that never did are left out): each job's versions read newest first, down to
        that one only (a held-out score every few versions parses a few versions' metrics,
        not all of them)."""
        ids = _check_jobs(job_ids)
        column = _metric_column(metric)
        newest = (
            select(PolicyVersion.version)
            .where(PolicyVersion.job_id == Job.id, column.is_not(None))
            .order_by(PolicyVersion.version.desc())
            .limit(1)
            .correlate(Job)
            .scalar_subquery()
        )
        statement = (
            select(Job.id, PolicyVersion.version, column)
            .join(
                PolicyVersion, (PolicyVersion.job_id == Job.id) & (PolicyVersion.version == newest)
            )
            .where(Job.id.in_(ids))
        )
        with self._read() as session:
            rows = session.connection().execute(statement).all()
        return {job_id: (version, value) for job_id, version, value in rows}

    def run_tokens(self, job_ids: Sequence[int]) -> dict[int, dict[int, int]]:
        """job -> version -> the response tokens of the job's stored samples of that version
        (every finish reason), from the per-version totals, in one query across the jobs."""
        ids = _check_jobs(job_ids)
        statement = (
            select(
                VersionSampleStats.job_id,
                VersionSampleStats.policy_version,
                func.sum(VersionSampleStats.response_tokens).label("tokens"),
            )
            .where(VersionSampleStats.job_id.in_(ids))
            .group_by(VersionSampleStats.job_id, VersionSampleStats.policy_version)
        )
        with self._read() as session:
            per_job = _columns_per_job(session.connection(), statement)
        return {
            job_id: dict(zip(versions, map(int, counts), strict=True))
            for job_id, (versions, counts) in per_job.items()
        }

    def token_totals(self, job_ids: Sequence[int]) -> dict[int, int]:
        """job -> the response tokens of all its stored samples (as `run_tokens`, summed)."""
        ids = _check_jobs(job_ids)
        statement = (
            select(VersionSampleStats.job_id, func.sum(VersionSampleStats.response_tokens))
            .where(VersionSampleStats.job_id.in_(ids))
            .group_by(VersionSampleStats.job_id)
        )
        with self._read() as session:
            rows = session.connection().execute(statement).all()
        return {job_id: int(count) for job_id, count in rows}

    def run_metric_names(self, job_ids: Sequence[int]) -> list[str]:
        """The metrics any of the jobs recorded at any version (named ones, then extra ones),
        sorted within each kind."""
        ids = _check_jobs(job_ids)
        named = [func.count(getattr(PolicyVersion, name)).label(name) for name in METRIC_TYPES]
        with self._read() as session:
            counts = session.execute(select(*named).where(PolicyVersion.job_id.in_(ids))).one()
            dialect = session.get_bind().dialect.name
            placeholders = ", ".join(f":j{i}" for i in range(len(ids)))
            query = text(_EXTRA_KEYS[dialect].format(ids=placeholders))
            extra = session.scalars(query, {f"j{i}": job for i, job in enumerate(ids)}).all()
        recorded = [name for name, count in zip(METRIC_TYPES, counts, strict=True) if count]
        return recorded + sorted(set(extra) - set(recorded))
