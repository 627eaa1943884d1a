"""Backends for the storage tests: every `repo` test runs on SQLite and on PostgreSQL.

PostgreSQL is the server at ``RLWB_TEST_POSTGRES_URL`` (default: user postgres, database
``test`` on 127.0.0.1:5432). Each run works in its own schema ``rlwb_test_<hex>`` (selected
with ``search_path``), dropped at the end, so concurrent runs cannot collide. When
PostgreSQL is unreachable its tests are skipped, except with ``CI=true``, where they fail.
"""

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import URL, make_url

from db import Repository, upgrade
from db.models import Job, Study

POSTGRES_URL = os.environ.get(
    "RLWB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
BACKENDS = ("sqlite", "postgresql")


def _postgres_admin() -> sa.Engine:
    """An engine on the PostgreSQL test database; fails or skips the test if unreachable."""
    engine = sa.create_engine(POSTGRES_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            pass
    except sa.exc.OperationalError as exc:
        engine.dispose()
        message = f"PostgreSQL is unreachable at {POSTGRES_URL}: {exc.orig}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (required because CI=true)", pytrace=False)
        pytest.skip(message)
    return engine


class PostgresSchemas:
    """Creates throw-away schemas and URLs that select them via ``search_path``."""

    def __init__(self, admin: sa.Engine) -> None:
        self.admin = admin
        self.created: list[str] = []

    def create(self) -> URL:
        name = f"rlwb_test_{secrets.token_hex(6)}"
        with self.admin.begin() as connection:
            connection.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        self.created.append(name)
        return make_url(POSTGRES_URL).update_query_dict({"options": f"-csearch_path={name}"})

    def drop_all(self) -> None:
        with self.admin.begin() as connection:
            for name in self.created:
                connection.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        self.admin.dispose()


@pytest.fixture(scope="session")
def postgres_schemas() -> Iterator[PostgresSchemas]:
    schemas = PostgresSchemas(_postgres_admin())
    yield schemas
    schemas.drop_all()


@pytest.fixture(scope="session", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def empty_database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> URL:
    """The URL of a new, empty database (a SQLite file, or a PostgreSQL schema)."""
    if backend == "sqlite":
        return URL.create("sqlite+pysqlite", database=str(tmp_path / "empty.db"))
    return request.getfixturevalue("postgres_schemas").create()


@pytest.fixture(scope="session")
def database_url(
    backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> URL:
    """A database migrated to head once per run and backend; `repo` empties it per test."""
    if backend == "sqlite":
        url = URL.create(
            "sqlite+pysqlite", database=str(tmp_path_factory.mktemp("sqlite") / "rlwb.db")
        )
    else:
        url = request.getfixturevalue("postgres_schemas").create()
    upgrade(url)
    return url


@pytest.fixture
def repo(database_url: URL) -> Iterator[Repository]:
    repository = Repository.from_url(database_url)
    yield repository
    with repository.engine.begin() as connection:
        connection.execute(sa.delete(Job))  # cascades to everything else
        connection.execute(sa.delete(Study))
    repository.close()
