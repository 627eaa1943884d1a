from pathlib import Path

import pytest
import sqlalchemy as sa

from db.session import SQLITE_FILENAME, make_engine, resolve_url


def test_default_is_a_sqlite_file_in_the_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("RLWB_DATA_DIR", str(tmp_path / "data"))
    url = resolve_url()
    assert url.get_backend_name() == "sqlite"
    assert url.database == str(tmp_path / "data" / SQLITE_FILENAME)
    engine = make_engine()
    with engine.connect() as connection:
        connection.exec_driver_sql("SELECT 1")
    engine.dispose()
    assert (tmp_path / "data" / SQLITE_FILENAME).is_file()


def test_default_data_dir_is_per_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.delenv("RLWB_DATA_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    expected = tmp_path / ".local" / "share" / "rlwb" / SQLITE_FILENAME
    assert resolve_url().database == str(expected)
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the XDG spec: absolute only
    assert resolve_url().database == str(expected)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert resolve_url().database == str(tmp_path / "xdg" / "rlwb" / SQLITE_FILENAME)


def test_database_url_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "sqlite:////tmp/elsewhere.db")
    assert resolve_url().database == "/tmp/elsewhere.db"
    assert resolve_url("sqlite:////tmp/given.db").database == "/tmp/given.db"


@pytest.mark.parametrize(
    "given",
    ["postgresql://u:p@db:5432/rl", "postgres://u:p@db:5432/rl", "postgresql+psycopg://u:p@db/rl"],
)
def test_postgresql_urls_use_psycopg3(given: str) -> None:
    url = resolve_url(given)
    assert url.drivername == "postgresql+psycopg"
    assert (url.username, url.host, url.database) == ("u", "db", "rl")


def test_sqlite_pragmas_hold_on_every_pooled_connection(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}", pool_size=2)
    connections = [engine.connect() for _ in range(2)]
    for connection in connections:
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        connection.close()
    engine.dispose()


def test_sqlite_foreign_keys_are_enforced(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'fk.db'}")
    with engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        connection.exec_driver_sql(
            "CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent(id))"
        )
    with pytest.raises(sa.exc.IntegrityError, match="FOREIGN KEY"), engine.begin() as connection:
        connection.exec_driver_sql("INSERT INTO child (parent_id) VALUES (42)")
    engine.dispose()


def test_sqlite_transactions_are_real(tmp_path: Path) -> None:
    """SQLAlchemy emits BEGIN itself, so even DDL rolls back."""
    engine = make_engine(f"sqlite:///{tmp_path / 't.db'}")
    with pytest.raises(RuntimeError), engine.begin() as connection:
        connection.exec_driver_sql("CREATE TABLE t (id INTEGER)")
        raise RuntimeError
    assert sa.inspect(engine).get_table_names() == []
    engine.dispose()


def test_sqlite_autocommit_connections_commit_each_statement(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("CREATE TABLE t (id INTEGER)")
        connection.exec_driver_sql("INSERT INTO t VALUES (1)")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM t").scalar() == 1
    engine.dispose()
