"""A train job with `devices = 2` through the worker's own code (`run_job`): the worker runs it
as two ranks, both spawned children it supervises; every version is recorded with its
checkpoint, every sample is stored once with its version and the rank that generated it, and
the audit replays samples of both ranks against their version's checkpoint. A rank killed or
hung fails the job naming it, while the worker (this process) goes on to the next job."""

import multiprocessing
import os
import signal
import threading
import time

import pytest

from db import SampleFilter
from tests.workers.helpers import train_config
from workers.jobs import run_job
from workers.scoring import audit_samples

pytestmark = pytest.mark.slow  # queued first under xdist (ranks start processes)

STEPS = 2


@pytest.mark.parametrize("lora", [None, {"rank": 4, "alpha": 8}], ids=["full", "lora"])
def test_a_two_device_job_stores_every_sample_once_with_its_rank(repo, settings, tiny_model, lora):
    config = train_config(tiny_model, steps=STEPS, batch_size=3, devices=2, lora=lora)
    job = repo.create_job("train", config, total_steps=STEPS)
    outcome = run_job(repo, job.id, settings)
    assert outcome.status == "succeeded", outcome.error
    assert [v.version for v in repo.list_versions(job.id)] == list(range(STEPS + 1))
    samples = repo.list_samples(SampleFilter(job.id), limit=100).items
    details = [repo.get_sample(s.id) for s in samples]
    assert len(details) == STEPS * 3 * 2  # each batch's 3 prompts x G=2, once
    for version in range(STEPS):
        ranks = sorted(d.rank for d in details if d.policy_version == version)
        assert ranks == [0, 0, 0, 0, 1, 1]  # rank 0 two groups, rank 1 one
    audits = audit_samples(repo, settings, [d.id for d in details if d.response_token_ids])
    assert {a["status"] for a in audits["samples"]} == {"pass"}


HANG_GUARD_S = 600.0  # a job that never ends fails the test instead of hanging the suite


def _rank(name: str) -> multiprocessing.Process:
    (child,) = [p for p in multiprocessing.active_children() if p.name == name]
    return child


def _after_version_1(repo, job_id: int, act) -> threading.Thread:
    """`act()` once the job has recorded version 1 (polled, within `HANG_GUARD_S`)."""

    def wait_then_act() -> None:
        deadline = time.monotonic() + HANG_GUARD_S
        while (latest := repo.latest_version(job_id)) is None or latest.version < 1:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        act()

    thread = threading.Thread(target=wait_then_act, daemon=True)
    thread.start()
    return thread


def _run_guarded(repo, job_id: int, settings):
    """`run_job` in this process (the worker), within `HANG_GUARD_S`."""
    outcome = []
    runner = threading.Thread(target=lambda: outcome.append(run_job(repo, job_id, settings)))
    runner.start()
    runner.join(HANG_GUARD_S)
    assert outcome, f"job {job_id} still running after {HANG_GUARD_S:.0f} s"
    return outcome[0]


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_killed_mid_job_fails_it_by_name_and_it_resumes_from_its_last_version(
    repo, settings, tiny_model, rank
):
    """Rank 0 too is a child of the worker: killing it fails the job, never the worker."""
    steps = 4
    config = train_config(tiny_model, steps=steps, batch_size=3, devices=2, checkpoint_every=1)
    job = repo.create_job("train", config, total_steps=steps)
    killer = _after_version_1(repo, job.id, lambda: os.kill(_rank(f"rank-{rank}").pid, 9))
    outcome = _run_guarded(repo, job.id, settings)
    killer.join()
    assert outcome.status == "failed"
    assert f"rank {rank} was killed (signal 9)" in repo.get_job(job.id).error
    last = repo.latest_version(job.id).version
    assert 1 <= last < steps
    assert not multiprocessing.active_children()  # every rank ended with the job

    repo.reopen(job.id)  # `rlwb resume`: the same worker takes the job again
    assert _run_guarded(repo, job.id, settings).status == "succeeded"
    versions = repo.list_versions(job.id)
    assert [v.version for v in versions] == list(range(steps + 1))  # continued, none redone
    samples = repo.list_samples(SampleFilter(job.id), limit=100).items
    assert len(samples) == steps * 3 * 2  # the failed step's batch was never stored


def test_a_rank_that_hangs_fails_the_job_within_its_collective_timeout(repo, settings, tiny_model):
    """Rank 1 stopped (alive, answering nothing) after version 1: rank 0's next collective
    fails after the job's `collective_timeout_s`, the job fails naming rank 1 as the one still
    running, and the worker takes its next job."""
    steps = 4
    config = train_config(
        tiny_model, steps=steps, batch_size=3, devices=2, collective_timeout_s=5.0
    )
    job = repo.create_job("train", config, total_steps=steps)
    stopper = _after_version_1(repo, job.id, lambda: os.kill(_rank("rank-1").pid, signal.SIGSTOP))
    outcome = _run_guarded(repo, job.id, settings)
    stopper.join()
    assert outcome.status == "failed"
    error = repo.get_job(job.id).error
    assert "rank 0 failed" in error and "still running: rank 1" in error, error
    assert not multiprocessing.active_children()  # the stopped rank was ended too

    following = repo.create_job("train", train_config(tiny_model, steps=1), total_steps=1)
    assert _run_guarded(repo, following.id, settings).status == "succeeded"
