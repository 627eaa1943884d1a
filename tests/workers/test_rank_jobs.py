"""A train job with `devices = 2` through the worker's own code (`run_job`): the worker runs it
as two ranks (itself rank 0, a spawned child rank 1); every version is recorded with its
gathered checkpoint, every sample is stored once with its version and the rank that generated
it, and the audit replays samples of both ranks against their version's checkpoint."""

import pytest

from db import SampleFilter
from tests.workers.helpers import train_config
from workers.jobs import run_job
from workers.scoring import audit_samples

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
