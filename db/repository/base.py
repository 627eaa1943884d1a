"""What every part of the repository shares: sessions, job lookup and input checks."""

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from db.enums import JobStatus
from db.errors import InvalidTransition, InvalidValue, JobNotFound, StaleOwner
from db.models import Job
from db.session import session_factories

ACTIVE_STATUSES = (JobStatus.RUNNING, JobStatus.CANCELLING)
MAX_PAGE_SIZE = 1000


class RepositoryBase:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._reader, self._writer = session_factories(engine)

    @contextmanager
    def _read(self) -> Iterator[Session]:
        """A read-only session over one snapshot."""
        with self._reader() as session:
            yield session

    @contextmanager
    def _write(self) -> Iterator[Session]:
        """A session whose work commits together, or not at all if the block raises."""
        with self._writer.begin() as session:
            yield session


def load_job(session: Session, job_id: int, *, for_update: bool = False) -> Job:
    """The job row (locked until commit on PostgreSQL if ``for_update``), or `JobNotFound`."""
    statement = select(Job).where(Job.id == job_id)
    if for_update:
        statement = statement.with_for_update()
    job = session.scalars(statement).one_or_none()
    if job is None:
        raise JobNotFound(job_id)
    return job


def lock_job(session: Session, job_id: int, fence: int | None) -> Job:
    """The job row locked for a write; with ``fence``, only if that attempt still owns it
    (checked in the transaction of the write, so a stale owner can never write)."""
    job = load_job(session, job_id, for_update=True)
    if fence is not None and job.fence != fence:
        raise StaleOwner(job_id, fence, job.fence)
    return job


def require_active(job: Job, action: str) -> None:
    """Writes that belong to a running job are refused once it is queued or finished."""
    if job.status not in ACTIVE_STATUSES:
        raise InvalidTransition(job.id, job.status.value, action)


def check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidValue(f"limit: {limit} is outside 1..{MAX_PAGE_SIZE}")


def check_finite(value: float | None, field: str) -> None:
    if value is not None and not math.isfinite(value):
        raise InvalidValue(f"{field}: {value!r} is not finite (store None and say why instead)")


def check_non_negative(value: int, field: str) -> None:
    if value < 0:
        raise InvalidValue(f"{field}: {value} is negative")


def check_json(value: Any, field: str) -> None:
    """JSON columns take plain JSON only (no NaN or infinity: PostgreSQL rejects them; no
    lone surrogate: not UTF-8)."""
    try:
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"{field}: not storable as JSON: {exc}") from None


def check_text(value: str | None, field: str) -> None:
    """Text is stored the same on every backend: no NUL character (PostgreSQL cannot hold
    one) and no lone surrogate (not UTF-8)."""
    if value is None:
        return
    if "\x00" in value:
        raise InvalidValue(f"{field}: contains a NUL character, which cannot be stored")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidValue(f"{field}: contains a lone surrogate (at {exc.start})") from None
