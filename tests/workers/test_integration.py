"""A real ``celery worker`` (threads pool, one job at a time) against a real Redis
(`tests.workers.stack`), on SQLite; the start order also on the embedded broker."""

import json
import os
import signal
import subprocess
import sys

import pytest

from db import JobStatus
from tests.workers.helpers import SLOW_REWARD, assert_consistent, train_config, wait_for

pytestmark = pytest.mark.slow


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


# Submits six jobs while the clock reads just short of a 20th digit of nanoseconds, cancels the
# second and third while they are queued, then submits a seventh once the clock has gained its
# digit (the embedded broker stamps its message files with the clock; Redis ignores it).
SUBMIT_ACROSS_A_DIGIT = """
import itertools, json, sys, types
from workers import api, embedded_broker
clock = itertools.count(10**19 - 1000)
embedded_broker.time = types.SimpleNamespace(time_ns=lambda: next(clock))
configs = json.loads(sys.argv[1])
ids = [api.submit_job("train", config).id for config in configs[:-1]]
for job in ids[1:3]:
    api.cancel_job(job)
clock = itertools.count(10**19)
print(json.dumps([*ids, api.submit_job("train", configs[-1]).id]))
"""


@pytest.mark.parametrize("deployment", ["embedded_stack", "stack"])
def test_jobs_start_in_submission_order(deployment, request, tiny_model):
    """A job submitted later started before four queued earlier, after two queued jobs were
    cancelled (issue 32): the embedded broker's file names, which order its queue, gained a
    digit then and sorted the newer first."""
    stack = request.getfixturevalue(deployment)
    with stack.worker("gpu0"):
        [running] = stack.submit(train_config(tiny_model, steps=1000, reward=SLOW_REWARD))
        wait_for(lambda: stack.status(running) is JobStatus.RUNNING, 120, "the first job")
        configs = json.dumps([train_config(tiny_model, steps=1)] * 7)
        argv = [sys.executable, "-c", SUBMIT_ACROSS_A_DIGIT, configs]
        done = subprocess.run(argv, cwd=stack.root, env=stack.env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        queued = json.loads(done.stdout)
        stack.repo.request_cancel(running)
        jobs = [running, *queued]
        wait_for(lambda: all(stack.status(j).is_terminal for j in jobs), 600, "every job")
    infos = [stack.repo.get_job(job) for job in jobs]
    started = sorted((i for i in infos if i.started_at is not None), key=lambda i: i.started_at)
    assert [i.id for i in started] == [running, queued[0], *queued[3:]], stack.log("gpu0")
    assert [i.status for i in infos if i.id in queued[1:3]] == [JobStatus.CANCELLED] * 2
