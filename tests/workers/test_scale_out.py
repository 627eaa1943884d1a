"""Scale-out is more workers: two real workers on one Redis (and PostgreSQL) run two jobs at
once, and killing one leaves the other's job untouched."""

import os
import signal

import pytest

from db import JobStatus
from tests.workers.helpers import SLOW_REWARD, assert_consistent, train_config, wait_for

pytestmark = pytest.mark.slow


def test_two_workers_run_two_jobs_and_one_dies_alone(pg_stack, tiny_model):
    stack, repo, steps = pg_stack, pg_stack.repo, 60
    first, second = stack.submit(
        *[train_config(tiny_model, steps=steps, reward=SLOW_REWARD) for _ in range(2)]
    )
    with stack.worker("gpu0") as gpu0, stack.worker("gpu1"):

        def both_running() -> bool:
            jobs = [repo.get_job(j) for j in (first, second)]
            return all(
                j.status is JobStatus.RUNNING and (j.current_version or 0) >= 1 for j in jobs
            )

        wait_for(both_running, 120, "both jobs to run at once")
        owners = {repo.get_job(j).celery_task_id: j for j in (first, second)}
        active = stack.api("api.queue_overview()")["active"]
        by_worker = {task["worker"].split("@")[0]: owners[task["task_id"]] for task in active}
        assert set(by_worker) == {"gpu0", "gpu1"}
        killed, survivor = by_worker["gpu0"], by_worker["gpu1"]
        fence = repo.get_job(survivor).fence

        os.kill(gpu0.pid, signal.SIGKILL)
        gpu0.wait()
        wait_for(lambda: stack.status(survivor).is_terminal, 180, "the survivor's job")
        wait_for(lambda: stack.status(killed).is_terminal, 240, "the killed worker's job")
    untouched = repo.get_job(survivor)
    assert untouched.status is JobStatus.SUCCEEDED, stack.log("gpu1")
    assert untouched.attempts == 1 and untouched.fence == fence
    resumed = repo.get_job(killed)
    assert resumed.status is JobStatus.SUCCEEDED and resumed.attempts == 2
    for job in (first, second):
        assert_consistent(repo, job, steps, 4)
