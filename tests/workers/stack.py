"""A real ``celery worker`` deployment for the integration tests: an empty Redis database
(1-15, flushed at the end), a database (SQLite, or a throw-away PostgreSQL schema) and a data
dir. Without Redis (or PostgreSQL) these tests skip, except with ``CI=true``.
"""

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest
from sqlalchemy import URL

from db import JobStatus, Repository, upgrade
from tests.workers.helpers import REGISTERED_REWARDS, running, wait_for

ROOT = Path(__file__).resolve().parents[2]
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
CLAIM_KEY = "rlwb:tests:claimed"
# A hang guard for one command against the deployment (quiet: 1-7 s); only a hang reaches it.
COMMAND_LIMIT_S = 300


def claim_redis() -> Iterator[str]:
    """An empty Redis database of its own (a generator for a fixture)."""
    import redis

    try:
        redis.Redis(REDIS_HOST, REDIS_PORT, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        message = f"Redis is unreachable at {REDIS_HOST}:{REDIS_PORT}: {exc}"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message} (required because CI=true)", pytrace=False)
        pytest.skip(message)
    for index in range(1, 16):
        client = redis.Redis(REDIS_HOST, REDIS_PORT, db=index)
        if client.dbsize() == 0 and client.set(CLAIM_KEY, os.getpid(), nx=True, ex=3600):
            break
    else:
        pytest.fail("no empty Redis database among 1-15", pytrace=False)
    try:
        yield f"redis://{REDIS_HOST}:{REDIS_PORT}/{index}"
    finally:
        client.flushdb()


class Stack:
    """A worker deployment's environment: Redis (None: the embedded broker), a SQLite
    database, a data dir."""

    def __init__(
        self, redis_url: str | None, root: Path, database: str | URL | None = None
    ) -> None:
        if database is None:
            database = f"sqlite:///{root / 'rlwb.db'}"
        if isinstance(database, URL):
            database = database.render_as_string(hide_password=False)
        self.root = root
        inherited = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        self.env = {
            **inherited,
            **({"REDIS_URL": redis_url} if redis_url else {}),
            "DATABASE_URL": database,
            "RLWB_DATA_DIR": str(root / "data"),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "RLWB_REWARDS": REGISTERED_REWARDS,
            "RLWB_MODEL_ROOTS": tempfile.gettempdir(),  # where the tests' models are
            # recovery re-queues a dead worker's job after 10 s without a heartbeat (one every
            # 2 s): five missed in a row, which a live worker on a loaded machine never misses
            "RLWB_HEARTBEAT_TIMEOUT": "10",
        }
        upgrade(database)
        self.repo = Repository.from_url(database)

    @contextmanager
    def worker(self, name: str, *args: str) -> Iterator[Popen]:
        log = self.root / f"{name}.log"
        argv = [sys.executable, "-m", "workers", "worker", *args, "-n", f"{name}@%h"]
        with running(argv, self.env, self.root, log) as process:
            wait_for(lambda: " ready." in log.read_text(), 60, f"worker {name} to start")
            yield process

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()

    def celery(self, *args: str) -> str:
        """The Celery command line against this deployment."""
        return self._run([sys.executable, "-m", "celery", "-A", "workers.app", *args])

    def api(self, expression: str) -> Any:
        """Evaluate ``expression`` (with ``api`` = `workers.api`) in a fresh process."""
        code = "import json; from workers import api; print(json.dumps((%s), default=str))"
        code %= expression
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_LIMIT_S,
            check=True,
        )
        return json.loads(done.stdout.splitlines()[-1])

    def submit(self, *configs: dict[str, Any]) -> list[int]:
        """Submit train jobs, in order, through `workers.api.submit_job`."""
        literal = json.dumps(json.dumps(configs))  # a JSON string is a Python literal too
        return self.api(f"[api.submit_job('train', c).id for c in json.loads({literal})]")

    def status(self, job_id: int) -> JobStatus:
        return self.repo.get_job(job_id).status

    def rlwb(self, *args: str) -> str:
        """The ``rlwb`` command line against this deployment; its output."""
        return self._run([sys.executable, "-m", "ui", *args])

    def _run(self, argv: list[str]) -> str:
        """``argv`` run in this deployment's directory and environment; its output (it must
        succeed within `COMMAND_LIMIT_S`)."""
        done = subprocess.run(
            argv,
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_LIMIT_S,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout
