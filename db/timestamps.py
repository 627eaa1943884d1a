"""UTC timestamps: the current time (this process's clock, or the database server's) and a
column type that keeps timestamps aware."""

from datetime import UTC, datetime

from sqlalchemy import DateTime, func, select
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(UTC)


def database_now(session: Session) -> datetime:
    """The database server's clock, now: heartbeats are written and judged by it, so that
    workers whose clocks disagree still agree on which owner is alive (SQLite: the clock of
    this machine, the only one that opens the file; PostgreSQL: the time of the call, not
    of the transaction's start)."""
    if session.get_bind().dialect.name == "sqlite":
        now = session.scalar(select(func.strftime("%Y-%m-%d %H:%M:%f", "now")))
        return datetime.fromisoformat(now).replace(tzinfo=UTC)
    return session.scalar(select(func.clock_timestamp())).astimezone(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite stores it naive, in UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime; pass a timezone-aware one")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
