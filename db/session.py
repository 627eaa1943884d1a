"""Engines and sessions from ``DATABASE_URL``.

Unset ``DATABASE_URL`` means a SQLite file ``rlwb.db`` in the data directory (`data_dir`).
SQLite connections get WAL mode, foreign keys and a busy timeout on every connect, and
SQLAlchemy (not the sqlite3 driver) emits BEGIN: ``BEGIN IMMEDIATE`` for write sessions, so a
writer takes the write lock up front and waits for it instead of failing half-way with
"database is locked". PostgreSQL uses psycopg 3; ``postgresql://`` URLs are rewritten to it.
"""

import contextlib
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
    """``RLWB_DATA_DIR``; unset or empty: one per user wherever ``rlwb`` runs,
    ``$XDG_DATA_HOME/rlwb`` (an absolute ``XDG_DATA_HOME``, else ``~/.local/share``), never
    the working directory. The one reader of those variables, for the database file, the
    worker and the UI alike."""
    configured = os.environ.get("RLWB_DATA_DIR")
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "rlwb"


def private_dir(path: Path) -> Path:
    """``path``, created with its missing parents for this user alone (0700), as the data
    directory and the folders in it are: other local users read none of the jobs' data. An
    existing folder is left as it is."""
    for folder in reversed([p for p in (path, *path.parents) if not p.exists()]):
        folder.mkdir(mode=0o700, exist_ok=True)
    return path


def private_file(path: Path) -> Path:
    """``path``, created empty for this user alone (0600) where absent (a database file:
    SQLite gives its journal and WAL files the database's mode). Its folder must exist."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    return path


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
        database = Path(resolved.database)
        private_dir(database.parent)
        private_file(database)
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
