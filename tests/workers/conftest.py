"""Fixtures of the worker tests: a tiny model, a migrated SQLite database per test, and the
environment (data dir, database, no Redis) that `workers` reads."""

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# (`tests/conftest.py` has given this process a data dir of its own, before `workers` is
# imported: the embedded broker of `workers.app` stays out of the working tree.)
from db import Repository, upgrade
from tests.db.conftest import postgres_schemas  # noqa: F401  (the fixture)
from tests.workers.stack import Stack, claim_redis
from workers.settings import Settings


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from core_engine.toy import save_tiny_checkpoint

    return str(save_tiny_checkpoint(tmp_path_factory.mktemp("model") / "tiny", arch="llama"))


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh data dir and SQLite database (migrated), embedded broker; returns the data dir."""
    data = tmp_path / "data"
    monkeypatch.setenv("RLWB_DATA_DIR", str(data))
    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{data / 'rlwb.db'}")
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv("RLWB_MODEL_ROOTS", tempfile.gettempdir())  # where the tests' models are
    upgrade()
    return data


@pytest.fixture
def settings(env: Path) -> Settings:
    return Settings.from_env()


@pytest.fixture
def repo(env: Path) -> Iterator[Repository]:
    from workers.app import repository

    yield repository()


@pytest.fixture
def eager(env: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Tasks run inside their send (no broker); returns the task ids revoked meanwhile."""
    from workers.app import app

    monkeypatch.setitem(app.conf, "task_always_eager", True)
    revoked: list[str] = []
    monkeypatch.setattr(app.control, "revoke", lambda task_id, **_: revoked.append(task_id))
    return revoked


@pytest.fixture
def redis_url() -> Iterator[str]:
    yield from claim_redis()


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    """A real worker deployment on SQLite."""
    stack = Stack(redis_url, tmp_path)
    yield stack
    stack.repo.close()


@pytest.fixture
def embedded_stack(tmp_path: Path) -> Iterator[Stack]:
    """A real worker deployment on the defaults: SQLite and the embedded broker."""
    stack = Stack(None, tmp_path)
    yield stack
    stack.repo.close()


@pytest.fixture
def pg_stack(redis_url: str, tmp_path: Path, postgres_schemas) -> Iterator[Stack]:  # noqa: F811
    """A real worker deployment on PostgreSQL (a throw-away schema)."""
    stack = Stack(redis_url, tmp_path, postgres_schemas.create())
    yield stack
    stack.repo.close()
