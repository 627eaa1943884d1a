"""Train jobs of a small sweep for the Runs view's tests: a grid of learning rates, a few
seeds each (alone or as a study's jobs), versions with a reward curve and a held-out score every
few versions."""

import random
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa

from db import (
    BatchRecord,
    JobInfo,
    PolicyMetrics,
    PolicyVersionRecord,
    Repository,
    SampleRecord,
    StudyInfo,
)
from db.models import PolicyVersion
from db.repository.studies import StudyJobRecord

HELDOUT_EVERY = 2


def _sample(version: int, index: int, length: int) -> SampleRecord:
    return SampleRecord(
        prompt_index=index,
        group_index=0,
        policy_version=version,
        prompt_text=f"{index}?",
        response_text="7" * length,
        response_token_ids=[7] * length,
        behaviour_logprobs=[-0.1] * length,
        finish_reason="stop",
        reward=1.0,
        advantage=0.0,
    )


def seed_run(
    repo: Repository, model: Path, lr: float, seed: int, versions: int, rng: random.Random
) -> JobInfo:
    """A finished train job of ``versions`` versions (`finish_run`)."""
    config = {**_config(model, versions, lr), "seed": seed}
    job = repo.create_job("train", config, total_steps=versions - 1)
    return finish_run(repo, job, lr, versions, rng)


def _config(model: Path, versions: int, lr: float) -> dict:
    return {"model": str(model), "task": "always7", "steps": versions - 1, "lr": lr}


def finish_run(
    repo: Repository, job: JobInfo, lr: float, versions: int, rng: random.Random
) -> JobInfo:
    """The queued ``job`` run to its end: ``versions`` versions, reward_mean rising with noise,
    a held-out score at every `HELDOUT_EVERY`-th version and the last, and one accepted batch
    of two samples (random lengths) per version."""
    repo.mark_running(job.id)
    for version in range(versions):
        extra = {"generate_s": rng.uniform(0.1, 0.2)}
        if version % HELDOUT_EVERY == 0 or version == versions - 1:
            extra["heldout_accuracy"] = round(rng.uniform(0, 1), 3)
        metrics = PolicyMetrics(
            reward_mean=version * lr * 100 + rng.uniform(-0.1, 0.1), kl=0.01, extra=extra
        )
        parent = version - 1 if version else None
        repo.record_policy_version(PolicyVersionRecord(job.id, version, parent, metrics=metrics))
        samples = [_sample(version, i, rng.randint(1, 5)) for i in range(2)]
        repo.record_batch(BatchRecord(job.id, version, version, "accepted", samples))
        repo.update_progress(job.id, version)
    _spread_in_time(repo, job.id, rng)
    return repo.mark_succeeded(job.id)


def _spread_in_time(repo: Repository, job_id: int, rng: random.Random) -> None:
    """The versions made 2-4 s apart from the job's start, as a trainer makes them (recorded
    here within milliseconds)."""
    started = repo.get_job(job_id).started_at
    seconds = 0.0
    with repo.engine.begin() as connection:
        for version in range(len(repo.list_versions(job_id))):
            seconds += rng.uniform(2, 4)
            connection.execute(
                sa.update(PolicyVersion)
                .where(PolicyVersion.job_id == job_id, PolicyVersion.version == version)
                .values(created_at=started + timedelta(seconds=seconds))
            )


def seed_sweep(
    repo: Repository, model: Path, lrs: tuple[float, ...], seeds: int, versions: int
) -> list[JobInfo]:
    """One run per (learning rate, seed)."""
    rng = random.Random(1234)
    return [seed_run(repo, model, lr, seed, versions, rng) for lr in lrs for seed in range(seeds)]


def seed_study(
    repo: Repository, name: str, model: Path, lrs: tuple[float, ...], seeds: int, versions: int
) -> tuple[StudyInfo, list[JobInfo]]:
    """A grid study of learning rates x ``seeds`` seeds, all its jobs made at once and run
    to their ends (`finish_run`); the study as it then is."""
    base = _config(model, versions, lrs[0])
    space = {"grid": {"lr": list(lrs)}, "seed": 0}
    study = repo.create_study(
        name, "grid", base, space, seeds=seeds, max_jobs=len(lrs) * seeds, concurrency=99
    )
    planned = [
        StudyJobRecord({**base, "lr": lr, "seed": seed}, {"lr": lr}, versions - 1)
        for lr in lrs
        for seed in range(seeds)
    ]
    _, jobs = repo.schedule_study(study.id, lambda info, made, room: planned[made:])
    rng = random.Random(4321)
    finished = [finish_run(repo, job, job.config["lr"], versions, rng) for job in jobs]
    repo.schedule_study(study.id, lambda info, made, room: [])  # every job ended: completed
    return repo.get_study(study.id), finished
