"""A real ``celery worker`` (threads pool, one job at a time) against a real Redis.

Each test takes an empty Redis database (1-15) and flushes it at the end; its worker gets its
own SQLite database and data dir. Without Redis these tests skip, except with ``CI=true``.
"""

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from db import JobStatus, Repository, upgrade
from tests.workers.helpers import (
    REGISTERED_REWARDS,
    SLOW_REWARD,
    assert_consistent,
    running,
    train_config,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
CLAIM_KEY = "rlwb:tests:claimed"


@pytest.fixture
def redis_url() -> Iterator[str]:
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
    """A worker deployment's environment: Redis, a SQLite database, a data dir."""

    def __init__(self, redis_url: str, root: Path) -> None:
        database = f"sqlite:///{root / 'rlwb.db'}"
        self.root = root
        self.env = {
            **os.environ,
            "REDIS_URL": redis_url,
            "DATABASE_URL": database,
            "RLWB_DATA_DIR": str(root / "data"),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": str(ROOT),
            "RLWB_REWARDS": REGISTERED_REWARDS,
            "RLWB_HEARTBEAT_TIMEOUT": "5",  # recovery re-queues a dead worker's job after 5 s
        }
        upgrade(database)
        self.repo = Repository.from_url(database)

    @contextmanager
    def worker(self, name: str) -> Iterator[Popen]:
        log = self.root / f"{name}.log"
        argv = [sys.executable, "-m", "workers", "worker", "-n", f"{name}@%h"]
        with running(argv, self.env, self.root, log) as process:
            wait_for(lambda: " ready." in log.read_text(), 60, f"worker {name} to start")
            yield process

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()

    def celery(self, *args: str) -> str:
        """The Celery command line against this deployment."""
        argv = [sys.executable, "-m", "celery", "-A", "workers.app", *args]
        done = subprocess.run(
            argv, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

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
            timeout=60,
            check=True,
        )
        return json.loads(done.stdout.splitlines()[-1])

    def submit(self, *configs: dict[str, Any]) -> list[int]:
        """Submit train jobs, in order, through `workers.api.submit_job`."""
        literal = json.dumps(json.dumps(configs))  # a JSON string is a Python literal too
        return self.api(f"[api.submit_job('train', c).id for c in json.loads({literal})]")

    def status(self, job_id: int) -> JobStatus:
        return self.repo.get_job(job_id).status


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    stack = Stack(redis_url, tmp_path)
    yield stack
    stack.repo.close()


def test_a_worker_runs_reports_and_cancels_jobs(stack, tiny_model):
    repo = stack.repo
    configs = [
        train_config(tiny_model, steps=4, reward=SLOW_REWARD),
        train_config(tiny_model, steps=1000, reward=SLOW_REWARD),
        train_config(tiny_model),
    ]
    with stack.worker("gpu0"):
        assert "pong" in stack.celery("inspect", "ping", "--timeout", "1")
        first, second, third = stack.submit(*configs)  # run one after the other
        steps = set()

        def finished() -> bool:
            job = repo.get_job(first)
            steps.add(job.step)
            return job.status.is_terminal

        wait_for(finished, 90, "the first job", interval=0.05)
        assert stack.status(first) is JobStatus.SUCCEEDED, stack.log("gpu0")
        assert len(steps) > 2  # progress was visible while it ran
        assert_consistent(repo, first, 4, 4)

        wait_for(lambda: (repo.get_job(second).current_version or 0) >= 2, 60, "versions")
        task_id, third_task = (repo.get_job(j).celery_task_id for j in (second, third))
        assert task_id in stack.celery("inspect", "active", "--timeout", "1")
        assert "revoked" in stack.celery("control", "revoke", third_task)
        overview, state, status = stack.api(
            f"api.queue_overview(), api.celery_app().AsyncResult({task_id!r}).state, "
            f"api.cancel_job({second}).status"
        )
        assert state == "PROGRESS"  # the live ping next to the job row's progress
        assert overview["workers_online"] == 1
        assert [task["task_id"] for task in overview["active"]] == [task_id]
        assert overview["reserved"] == []  # the third waits in Redis (prefetch 1)
        assert status == "cancelling"

        wait_for(lambda: stack.status(second).is_terminal, 60, "the cancel")
        cancelled = repo.get_job(second)
        assert cancelled.status is JobStatus.CANCELLED and cancelled.step < 1000
        assert_consistent(repo, second, cancelled.current_version, 4)

        # the worker takes the revoked task next and drops it without running it
        wait_for(
            lambda: f"Discarding revoked task: workers.train[{third_task}]" in stack.log("gpu0"),
            30,
            "the drop",
        )
        assert repo.get_job(third).attempts == 0


def test_a_killed_worker_loses_nothing_and_its_job_resumes(stack, tiny_model):
    repo = stack.repo
    steps = 8
    [job] = stack.submit(train_config(tiny_model, steps=steps, reward=SLOW_REWARD))
    with stack.worker("gpu0") as worker:
        wait_for(lambda: (repo.get_job(job).current_version or 0) >= 3, 90, "versions")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    killed = repo.get_job(job)
    assert killed.status is JobStatus.RUNNING and killed.attempts == 1
    before = {v.version: v.weights_checksum for v in repo.list_versions(job)}

    # no worker: a job submitted now waits in Redis; purge drops it, cancel closes its row
    [dropped] = stack.submit(train_config(tiny_model))
    assert "Purged 1 message" in stack.celery("purge", "--force", "--queues", "gpu")
    assert repo.request_cancel(dropped).status is JobStatus.CANCELLED

    with stack.worker("gpu1"):
        wait_for(lambda: stack.status(job).is_terminal, 90, "the resumed job")
    info = repo.get_job(job)
    assert info.status is JobStatus.SUCCEEDED, stack.log("gpu1")
    assert info.attempts == 2 and info.current_version == steps
    assert "re-queued" in stack.log("gpu1")
    assert_consistent(repo, job, steps, 4)
    after = {v.version: v.weights_checksum for v in repo.list_versions(job)}
    assert {v: after[v] for v in before} == before  # what was committed is untouched
