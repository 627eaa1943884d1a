"""Engines and sessions from ``DATABASE_URL``.

Unset ``DATABASE_URL`` means a SQLite file ``rlwb.db`` in ``RLWB_DATA_DIR`` (default ``./data``).
SQLite connections get WAL mode, foreign keys and a busy timeout on every connect, and
SQLAlchemy (not the sqlite3 driver) emits BEGIN: ``BEGIN IMMEDIATE`` for write sessions, so a
writer takes the write lock up front and waits for it instead of failing half-way with
"database is locked". PostgreSQL uses psycopg 3; ``postgresql://`` URLs are rewritten to it.
"""

import os
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import URL, Connection, Engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_FILENAME = "rlwb.db"
SQLITE_BUSY_TIMEOUT_S = 30.0
WRITE_OPTION = "rlwb_write"


def data_dir() -> Path:
    """``RLWB_DATA_DIR`` (unset or empty: ``data``, relative to the working directory); the
    one reader of that variable, for the database file, the worker and the UI alike."""
    return Path(os.environ.get("RLWB_DATA_DIR") or "data")


def resolve_url(url: str | URL | None = None) -> URL:
    """The URL to use: ``url``, else ``DATABASE_URL``, else the default SQLite file."""
    if url is None:
        url = os.environ.get("DATABASE_URL") or None
    if url is None:
        return URL.create("sqlite+pysqlite", database=str(data_dir() / SQLITE_FILENAME))
    resolved = make_url(url)
    if resolved.drivername in ("postgresql", "postgres"):
        resolved = resolved.set(drivername="postgresql+psycopg")
    return resolved


def make_engine(url: str | URL | None = None, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` (see `resolve_url`); ``kwargs`` go to `create_engine`."""
    resolved = resolve_url(url)
    if resolved.get_backend_name() != "sqlite":
        kwargs.setdefault("pool_pre_ping", True)
        return sqlalchemy.create_engine(resolved, **kwargs)
    if resolved.database and resolved.database != ":memory:":
        Path(resolved.database).parent.mkdir(parents=True, exist_ok=True)
    kwargs.setdefault("connect_args", {}).setdefault("timeout", SQLITE_BUSY_TIMEOUT_S)
    engine = sqlalchemy.create_engine(resolved, **kwargs)
    event.listen(engine, "connect", _on_sqlite_connect)
    event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (_on_sqlite_begin)
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _on_sqlite_begin(connection: Connection) -> None:
    options = connection.get_execution_options()
    if options.get("isolation_level") == "AUTOCOMMIT":
        return
    connection.exec_driver_sql("BEGIN IMMEDIATE" if options.get(WRITE_OPTION) else "BEGIN")


def session_factories(engine: Engine) -> tuple[sessionmaker[Session], sessionmaker[Session]]:
    """(reader, writer) session factories.

    Reader sessions see one snapshot for their whole transaction (REPEATABLE READ on
    PostgreSQL; a SQLite read transaction already does). Writer sessions take SQLite's write
    lock at BEGIN.
    """
    read_engine = engine
    if engine.dialect.name == "postgresql":
        read_engine = engine.execution_options(isolation_level="REPEATABLE READ")
    reader = sessionmaker(read_engine, expire_on_commit=False)
    writer = sessionmaker(engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False)
    return reader, writer
