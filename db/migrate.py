"""Programmatic Alembic migrations (``db/migrations``), also behind ``python -m db``."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import URL, Connection

from db.session import make_engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


@contextmanager
def _migration_connection(url: str | URL | None) -> Iterator[Connection]:
    """One transaction for the whole migration run.

    On SQLite, foreign keys are switched off first (outside the transaction, where SQLite
    honours the pragma): batch migrations recreate tables, and dropping a referenced table
    with foreign keys on would cascade-delete its children. They are checked at the end.
    """
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            if sqlite:
                connection.connection.driver_connection.execute("PRAGMA foreign_keys=OFF")
            with connection.begin():
                yield connection
                if sqlite:
                    violations = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if violations:
                        raise RuntimeError(f"foreign key violations after migration: {violations}")
    finally:
        engine.dispose()


def _run(url: str | URL | None, action: Callable[[Config], object]) -> None:
    config = alembic_config()
    with _migration_connection(url) as connection:
        config.attributes["connection"] = connection
        action(config)


def upgrade(url: str | URL | None = None, revision: str = "head") -> None:
    """Upgrade the database at ``url`` (default: `db.session.resolve_url`) to ``revision``."""
    _run(url, lambda config: command.upgrade(config, revision))


def downgrade(url: str | URL | None, revision: str) -> None:
    """Downgrade the database at ``url`` to ``revision`` (``"base"`` drops every table)."""
    _run(url, lambda config: command.downgrade(config, revision))


def current(url: str | URL | None = None) -> None:
    """Print the database's current revision."""
    _run(url, command.current)


def revision(message: str, url: str | URL | None = None) -> None:
    """Autogenerate a revision from the models against the (upgraded) database at ``url``.
    Review the generated file by hand."""
    _run(url, lambda config: command.revision(config, message, autogenerate=True))


def heads() -> list[str]:
    """The head revisions of the migration scripts (one, unless branches diverged)."""
    return list(ScriptDirectory.from_config(alembic_config()).get_heads())
