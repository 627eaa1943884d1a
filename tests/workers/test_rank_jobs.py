"""A train job with `devices = 2` through the worker's own code (`run_job`): the worker runs it
as two ranks (itself rank 0, a spawned child rank 1); every version is recorded with its
gathered checkpoint, every sample is stored once with its version and the rank that generated
it, and the audit replays samples of both ranks against their version's checkpoint."""

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


def test_a_rank_killed_mid_job_fails_it_by_name_and_it_resumes_from_its_last_version(
    repo, settings, tiny_model
):
    steps = 4
    config = train_config(tiny_model, steps=steps, batch_size=3, devices=2, checkpoint_every=1)
    job = repo.create_job("train", config, total_steps=steps)

    def kill_rank_1_after_version_1() -> None:
        while (latest := repo.latest_version(job.id)) is None or latest.version < 1:
            time.sleep(0.05)
        (child,) = [p for p in multiprocessing.active_children() if p.name == "rank-1"]
        os.kill(child.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_rank_1_after_version_1, daemon=True)
    killer.start()
    outcome = run_job(repo, job.id, settings)
    killer.join()
    assert outcome.status == "failed"
    assert "rank 1 was killed (signal 9)" in repo.get_job(job.id).error
    last = repo.latest_version(job.id).version
    assert 1 <= last < steps

    repo.reopen(job.id)  # `rlwb resume`
    assert run_job(repo, job.id, settings).status == "succeeded"
    versions = repo.list_versions(job.id)
    assert [v.version for v in versions] == list(range(steps + 1))  # continued, none redone
    samples = repo.list_samples(SampleFilter(job.id), limit=100).items
    assert len(samples) == steps * 3 * 2  # the failed step's batch was never stored
