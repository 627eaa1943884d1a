"""Real ``celery worker`` processes on Redis and PostgreSQL: clean restarts cost no attempt,
a frozen owner's writes are refused once recovery gave its job to another worker, a cancelled
job resumes from its newest version from the shell, a revoke survives a restart, purged jobs
are sent again (on Redis and on the embedded broker), and a killed worker's rejected batches
are replaced, not added, by the retry."""

import json
import os
import signal

import pytest

from db import JobStatus
from tests.workers.helpers import (
    SLOW_REWARD,
    assert_consistent,
    samples_in_db,
    train_config,
    wait_for,
)

pytestmark = pytest.mark.slow


def version_of(stack, job_id: int) -> int:
    return stack.repo.get_job(job_id).current_version or 0


def test_restarts_cost_no_attempt_and_a_frozen_owner_cannot_write(pg_stack, tiny_model):
    stack, steps = pg_stack, 40
    stack.env["RLWB_MAX_ATTEMPTS"] = "2"  # two lost workers would fail the job; restarts don't
    job_file = stack.root / "job.json"
    job_file.write_text(json.dumps(train_config(tiny_model, steps=steps, reward=SLOW_REWARD)))
    job = int(stack.rlwb("submit", str(job_file)).split()[-1])
    assert f"{job:>6}  train    queued" in stack.rlwb("jobs")

    for restart in range(2):  # Ctrl-C twice, as with `make up`
        with stack.worker(f"gpu0-{restart}") as worker:
            target = 2 * (restart + 1)
            wait_for(lambda t=target: version_of(stack, job) >= t, 120, f"version {target}")
            worker.send_signal(signal.SIGINT)
            worker.wait(120)
        info = stack.repo.get_job(job)
        assert info.attempts == 0 and info.status is JobStatus.RUNNING, stack.log("gpu0-0")

    # a frozen owner: recovery gives its job to another worker after the heartbeat timeout
    with stack.worker("gpu0-2") as worker:
        wait_for(lambda: version_of(stack, job) >= 6, 120, "version 6")
        worker.send_signal(signal.SIGSTOP)
        frozen_at = version_of(stack, job)
        with stack.worker("gpu1"):
            wait_for(lambda: version_of(stack, job) >= frozen_at + 2, 120, "the new owner")
            worker.send_signal(signal.SIGCONT)  # wakes mid-step: nothing it sends is stored
            wait_for(lambda: stack.status(job).is_terminal, 180, "the job")
    info = stack.repo.get_job(job)
    assert info.status is JobStatus.SUCCEEDED, stack.log("gpu1")
    assert info.attempts == 2 and info.current_version == steps
    assert "re-queued" in stack.log("gpu1")
    assert_consistent(stack.repo, job, steps, 4)


def test_a_cancelled_job_resumes_from_its_newest_version(pg_stack, tiny_model):
    stack, steps = pg_stack, 200
    [job] = stack.submit(train_config(tiny_model, steps=steps, reward=SLOW_REWARD))
    with stack.worker("gpu0"):
        wait_for(lambda: version_of(stack, job) >= 2, 120, "versions")
        assert "cancelling" in stack.rlwb("cancel", str(job))
        wait_for(lambda: stack.status(job) is JobStatus.CANCELLED, 60, "the cancel")
        cancelled = stack.repo.get_job(job)
        assert "queued" in stack.rlwb("resume", str(job))
        target = cancelled.current_version + 3
        wait_for(lambda: version_of(stack, job) >= target, 120, "the resumed job")
        stack.api(f"api.cancel_job({job}).status")
        wait_for(lambda: stack.status(job).is_terminal, 60, "the second cancel")
    info = stack.repo.get_job(job)
    assert info.status is JobStatus.CANCELLED and info.current_version >= target
    assert_consistent(stack.repo, job, info.current_version, 4)
    kept = stack.repo.list_versions(job)[: cancelled.current_version + 1]
    assert [v.version for v in kept] == list(range(cancelled.current_version + 1))


def test_revoke_survives_a_restart_and_purged_jobs_are_sent_again(pg_stack, tiny_model):
    stack = pg_stack
    long, revoked, purged = stack.submit(
        train_config(tiny_model, steps=30, reward=SLOW_REWARD),
        train_config(tiny_model, steps=1),
        train_config(tiny_model, steps=1),
    )
    with stack.worker("gpu0"):
        wait_for(lambda: version_of(stack, long) >= 1, 120, "the first job")
        task = stack.repo.get_job(revoked).celery_task_id
        assert "revoked" in stack.celery("control", "revoke", task)
        wait_for(lambda: stack.status(revoked) is JobStatus.CANCELLED, 30, "the revoke")
    assert "Purged" in stack.celery("purge", "--force", "--queues", "gpu")

    with stack.worker("gpu1"):  # the database says what runs: not the purged broker
        wait_for(lambda: stack.status(purged).is_terminal, 180, "the purged job")
        wait_for(lambda: stack.status(long).is_terminal, 180, "the long job")
    assert stack.status(purged) is JobStatus.SUCCEEDED, stack.log("gpu1")
    assert stack.status(long) is JobStatus.SUCCEEDED
    assert "sent again" in stack.log("gpu1")
    never = stack.repo.get_job(revoked)
    assert never.status is JobStatus.CANCELLED and never.attempts == 0
    assert stack.repo.list_batches(revoked) == []


def test_a_killed_worker_s_rejected_batches_are_replaced_not_added(pg_stack, tiny_model):
    """Every batch is rejected (no reward variance), so nothing after version 0 is ever
    checkpointed: the resumed run redoes those batches with the same seeds."""
    stack, limit = pg_stack, 12
    config = train_config(tiny_model, steps=4, reward=SLOW_REWARD, drop_zero_variance_groups=True)
    [job] = stack.submit({**config, "max_consecutive_rejections": limit})
    with stack.worker("gpu0") as worker:
        wait_for(lambda: len(stack.repo.list_batches(job)) >= 5, 120, "rejected batches")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    with stack.worker("gpu1"):
        wait_for(lambda: stack.status(job).is_terminal, 180, "the retried job")
    info = stack.repo.get_job(job)
    assert info.attempts == 2 and info.status is JobStatus.STALLED  # as designed
    assert info.error.startswith("every sample scored 0.0 in ")
    batches = stack.repo.list_batches(job)
    assert len(batches) == limit + 1 and {b.status for b in batches} == {"rejected"}
    assert samples_in_db(stack.repo, job) == 4 * (limit + 1)


def test_jobs_purged_from_the_embedded_broker_are_sent_again(embedded_stack, tiny_model):
    """The default deployment (no broker server) reconciles too: the database says what is
    queued, whatever the message files say."""
    stack = embedded_stack
    jobs = stack.submit(train_config(tiny_model, steps=1), train_config(tiny_model, steps=1))
    messages = stack.root / "data" / "broker" / "queue"
    assert len(list(messages.glob("*.gpu.msg"))) == 2
    assert "Purged 2 messages" in stack.celery("purge", "--force", "--queues", "gpu")
    assert list(messages.glob("*.gpu.msg")) == []
    assert [stack.status(job) for job in jobs] == [JobStatus.QUEUED] * 2

    with stack.worker("gpu0"):
        for job in jobs:
            wait_for(lambda j=job: stack.status(j).is_terminal, 120, f"purged job {job}")
        overview = stack.api("api.queue_overview()")  # one broadcast, over the message files
        assert (overview["workers_online"], overview["active"]) == (1, [])
    assert [stack.status(job) for job in jobs] == [JobStatus.SUCCEEDED] * 2, stack.log("gpu0")
    assert stack.log("gpu0").count("sent again") == 2
    assert all(stack.repo.get_job(job).attempts == 1 for job in jobs)
